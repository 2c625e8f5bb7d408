"""A training script for the multi-process tests (tests/devices/test_distributed.py),
run under `nitro launch` or as one plain process:
`python dist_worker.py RUN_DIR [N_DEVS [DIE_AT_STEP]]`.

It trains `Sharded`, a Tiny on a train split only, whose build_data feeds this
process's shard of every global batch of 16 (`dist.shard`). With DIE_AT_STEP, rank 1
ends itself (os._exit(3)) at that train step, as a crashed host would.
"""

import os
import sys

from experiments import QuietLogger, Tiny, make_batches

import jaxnitro as nx

GLOBAL_BATCH = 16


class Sharded(Tiny):
    """Tiny's train split (4 global batches of 16), each process feeding its rows."""

    max_epochs: int = 2

    def build_data(self, dist):
        whole = make_batches(64, 64)[0]
        parts = {k: v if dist is None else dist.shard(v, GLOBAL_BATCH) for k, v in whole.items()}
        local = GLOBAL_BATCH // nx.world_size(dist)
        n = len(parts["x"])
        return {
            "train": [
                {k: v[s : s + local] for k, v in parts.items()} for s in range(0, n, local)
            ]
        }


class DiesAt(QuietLogger):
    """Rank 1 leaves at train step `step` without a word, as a killed host would."""

    def __init__(self, step):
        self.step = step

    def log_metrics(self, metrics, *, step, epoch, context, **kw):
        if context == "train" and step == self.step:
            os._exit(3)


def main(run_dir: str, n_devs: int = 1, die_at: int | None = None) -> None:
    dist = nx.init_distributed()
    keywords = {"run_dir": run_dir, "n_devs": n_devs}
    if die_at is not None:
        keywords["logger"] = DiesAt(die_at) if nx.rank(dist) == 1 else None
        keywords["log_every_n_steps"] = 1
        keywords["max_epochs"] = 50
    nitro = nx.Nitro(Sharded(), **keywords)
    nitro.train()
    print(f"rank {nx.rank(dist)} of {nx.world_size(dist)} done at step {nitro.current_step}")


if __name__ == "__main__":
    args = sys.argv[1:]
    main(args[0], *(int(a) for a in args[1:]))
