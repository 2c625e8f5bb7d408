"""What the default logger costs: jaxnitro with its default `JSONLogger` against
`logger=None`, on the dispatch-bound tutorial MLP (784-128-10, batch 100, synthetic
data, 60 batches an epoch).

Both sides run in this one process, interleaved: a handle with the default logger
(writing `metrics.jsonl` in a temporary run directory, at the default
`log_every_n_steps`) trains a few epochs, then a handle with `logger=None` does, and so
on. Epochs are timed by the loop itself (the history's `seconds`, which ends before the
epoch's validate and data lines are written: the train lines are what is measured), the
first epoch of each `train()` is dropped, and each logged epoch is paired with the
unlogged epoch measured next to it. The printed ratio is the median of those pairs'
throughput ratios: 1.0 means the logger costs nothing.

    python benchmarks/logger_cost.py            # 30 rounds of 2 epochs a side
    python benchmarks/logger_cost.py --quick    # 10 rounds
    python benchmarks/logger_cost.py --every 1  # a train line every step
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

from _common import (
    WORKLOADS,
    banner,
    make_experiment,
    paired_ratio,
    synthetic_batches,
)


def measure(rounds: int, epochs: int, every: int | None) -> dict:
    """Seconds per epoch of each side, interleaved, and their paired ratio."""
    import jax

    import jaxnitro as nx

    widths, batch, count = WORKLOADS["tutorial_mlp"]
    exp = make_experiment(widths, synthetic_batches(batch, count))
    thinning = {} if every is None else {"log_every_n_steps": every}

    def logged(run_dir: str) -> list[float]:
        nitro = nx.Nitro(
            exp(max_epochs=epochs + 1),
            run_dir=run_dir,
            checkpointer=None,
            **thinning,
        )
        nitro.train()
        return [row["seconds"] for row in nitro.history[2:]]  # epochs 2 on

    def unlogged() -> list[float]:
        nitro = nx.Nitro(
            exp(max_epochs=epochs + 1), logger=None, checkpointer=None, **thinning
        )
        nitro.train()
        return [row["seconds"] for row in nitro.history[2:]]  # epochs 2 on

    sides: dict[str, list[float]] = {"logger": [], "none": []}
    with tempfile.TemporaryDirectory() as run_dir:
        logged(run_dir)  # compile once; every later handle hits the cache
        unlogged()
        for _ in range(rounds):
            sides["logger"] += logged(run_dir)
            sides["none"] += unlogged()
    per_step = {k: statistics.median(v) / count * 1e6 for k, v in sides.items()}
    return {
        "ratio": paired_ratio(sides["none"], sides["logger"]),
        "us_per_step": per_step,
        "platform": jax.devices()[0].platform,
        "epochs": len(sides["none"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--every", type=int, default=None, help="log_every_n_steps (default: the run's)"
    )
    args = parser.parse_args()
    rounds = 10 if args.quick else 30
    print(banner())
    out = measure(rounds, 2, args.every)
    every = "default" if args.every is None else str(args.every)
    print(
        f"tutorial MLP on {out['platform']}, log_every_n_steps={every}, "
        f"{out['epochs']} epoch pairs: default logger / logger=None = "
        f"{out['ratio']:.3f}x paired ({out['us_per_step']['logger']:.0f} vs "
        f"{out['us_per_step']['none']:.0f} us/step, medians)"
    )


if __name__ == "__main__":
    main()
