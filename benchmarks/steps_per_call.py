"""Several optimizer steps per dispatch: jaxnitro at steps_per_call 1 and K against
the hand-written loop, in one process, interleaved, the default logger on.

The reference is `throughput.py`'s: a `jax.jit` + Optax RAdam loop over the same
in-memory batches, one dispatch per step. jaxnitro runs with its default JSON-lines
logger (a train line every 50 steps) and no checkpointer; its epochs are timed by the
loop itself (the history's `seconds`, validation excluded; there is none here), the
first epoch of each train() dropped. Each repetition times one epoch of each side in
turn, so a slow stretch of the shared machine hits all three alike; the ratios are
medians of per-repetition ratios (`paired_ratio`).

    python benchmarks/steps_per_call.py                      # K=8, both workloads
    python benchmarks/steps_per_call.py --steps-per-call 4 --reps 9
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from _common import WORKLOADS, make_experiment, paired_ratio, synthetic_batches
from throughput import reference_loop


def measure(name: str, per_call: int, reps: int) -> dict[str, float]:
    """Seconds per epoch of the reference and of jaxnitro at 1 and `per_call`, and
    the paired ratios reference / jaxnitro."""
    import jaxnitro as nx

    widths, batch, count = WORKLOADS[name]
    batches = synthetic_batches(batch, count)
    exp = make_experiment(widths, batches)
    scratch = tempfile.mkdtemp(prefix="nitro-spc-")

    def ours(k: int) -> float:
        run_dir = tempfile.mkdtemp(dir=scratch)
        nitro = nx.Nitro(
            exp(max_epochs=2), run_dir=run_dir, checkpointer=None, steps_per_call=k
        )
        nitro.train()
        return nitro.history[1]["seconds"]  # epoch 2: the programs are in hand

    ref_epochs, ref_first = reference_loop(widths, batches)
    ref_first()
    ref_epochs(1)

    def reference() -> float:
        start = time.perf_counter()
        ref_epochs(1)
        return time.perf_counter() - start

    sides: dict[str, list[float]] = {"reference": [], "k=1": [], f"k={per_call}": []}
    ours(1), ours(per_call)  # compile once: every later handle hits the cache
    for _ in range(reps):
        sides["reference"].append(reference())
        sides["k=1"].append(ours(1))
        sides[f"k={per_call}"].append(ours(per_call))
    result = {side: statistics.median(times) for side, times in sides.items()}
    for side in ("k=1", f"k={per_call}"):
        result[f"{side} paired"] = paired_ratio(sides["reference"], sides[side])
    result[f"k={per_call} / k=1 paired"] = paired_ratio(
        sides["k=1"], sides[f"k={per_call}"]
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps-per-call", type=int, default=8)
    parser.add_argument("--reps", type=int, default=21)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), action="append")
    args = parser.parse_args()
    import jax

    print(
        f"jax {jax.__version__} on {jax.devices()[0].platform}, {os.cpu_count()} cores"
    )
    k = args.steps_per_call
    for name in args.workload or list(WORKLOADS):
        r = measure(name, k, args.reps)
        print(
            f"{name}: reference/jaxnitro paired: k=1 {r['k=1 paired']:.3f}x, "
            f"k={k} {r[f'k={k} paired']:.3f}x; k={k} over k=1 "
            f"{r[f'k={k} / k=1 paired']:.3f}x (s/epoch medians: reference "
            f"{r['reference']:.4f}, k=1 {r['k=1']:.4f}, k={k} {r[f'k={k}']:.4f})"
        )


if __name__ == "__main__":
    main()
