"""A training script with validation, evaluation and prediction for the
multi-process tests (tests/devices/test_gather.py), run under `nitro launch` or as
one plain process: `python dist_eval_worker.py RUN_DIR OUT_DIR [N_DEVS [SHARDING
[EPOCHS]]]`.

It trains `EvalSharded` (TinyMetrics: accuracy, a summed confusion matrix, the
eval loss) with early stopping on the val accuracy, patience 1 (it does not
improve in epoch 2, so the run stops there, of 4), each process feeding its rows
of every global batch, the short last eval batches included
(`dist.shard(..., drop_last=False)`). Each rank then evaluates the test split and
predicts one 10-row batch (every rank the same batch), and writes what it saw to
OUT_DIR/rank{R}.json: the history's rows, the epoch it stopped at, the test
metrics and the predictions. With EPOCHS above 4 it resumes the run RUN_DIR
holds, without early stopping, to EPOCHS.
"""

import json
import sys
from pathlib import Path

import jax
import numpy as np
from experiments import TinyMetrics, make_batches

import jaxnitro as nx

GLOBAL_BATCH = 16
VAL_BATCH = 8


def _local_batches(rows: dict, dist, batch: int) -> list:
    """This process's parts of the global batches of `batch` rows (all of them,
    the short last one too), cut into batches of its share."""
    parts = {
        k: v if dist is None else dist.shard(v, batch, drop_last=False)
        for k, v in rows.items()
    }
    local = batch // nx.world_size(dist)
    n = len(parts["x"])
    return [{k: v[s : s + local] for k, v in parts.items()} for s in range(0, n, local)]


class EvalSharded(TinyMetrics):
    """TinyMetrics on 64 train rows, 20 val rows (global batches 8, 8, 4) and 40
    test rows (16, 16, 8); each process feeds its rows of each."""

    max_epochs: int = 4

    def build_data(self, dist):
        splits = {
            "train": (make_batches(64, 64)[0], GLOBAL_BATCH),
            "val": (make_batches(20, 20, seed=1)[0], VAL_BATCH),
            "test": (make_batches(40, 40, seed=2)[0], GLOBAL_BATCH),
        }
        return {
            name: _local_batches(rows, dist, batch)
            for name, (rows, batch) in splits.items()
        }


def _plain(value):
    return np.asarray(value).tolist()


def main(
    run_dir: str,
    out_dir: str,
    n_devs: int = 1,
    sharding: str = "replicated",
    epochs: int = 4,
) -> None:
    keywords = {
        "run_dir": run_dir,
        "n_devs": n_devs,
        "sharding": sharding,
        "max_epochs": epochs,
        "eval_loss": True,
    }
    if epochs > EvalSharded.max_epochs:  # continue the run this run_dir holds
        keywords["resume"] = "auto"
    else:
        keywords["early_stop"] = nx.EarlyStopping("acc", "max", patience=1)
    # fsdp splits a leaf of 1024 elements or more: w1 (8, 128) and its moments.
    width = 128 if sharding == "fsdp" else EvalSharded.width
    nitro = nx.Nitro(EvalSharded(width=width), **keywords)
    nitro.train()
    seen = {
        "history": list(nitro.history),
        "epoch": nitro.current_epoch,
        "test": nitro.evaluate("test"),
        "predict": nitro.predict(make_batches(10, 10, seed=3)[0]),
    }
    rank = jax.process_index()
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(seen, default=_plain))
    world = jax.process_count()
    print(f"rank {rank} of {world} stopped at epoch {nitro.current_epoch}")


if __name__ == "__main__":
    args = sys.argv[1:]
    main(args[0], args[1], *(int(a) if a.isdigit() else a for a in args[2:]))
