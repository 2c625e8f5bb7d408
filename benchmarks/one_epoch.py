"""A whole short run, cold: one epoch in a fresh process, compile included.

The steady-state benchmarks drop each run's first epoch; a user's short run (a first
try, a sweep's trial, a smoke run) is all first epoch. Each side here trains one
epoch of the workload in a process of its own, with the persistent compilation cache
off, and its clock runs from after the imports, the backend's start-up and the data
build until the epoch's last loss is on the host:

- the hand-written loop: `throughput.py`'s `jax.jit` + Optax RAdam step over the
  epoch's batches, its parameters' initialization, `tx.init` and compile included;
- jaxnitro with `steps_per_call` 1, K (default 8) and no keyword ("auto"), each
  `Nitro(...)` and `train()` with its default JSON-lines logger, no checkpointer.

Beside each side's seconds: its steps per second over the whole run and the XLA
programs it compiled (`jax.monitoring`'s backend compile events): the calls loop
promises one train program whatever the epoch's tail (a call cut short at the epoch's
end runs the same program), and "auto" at most one more. The workload is the
tutorial MLP at 550 batches of 100 (an MNIST epoch; `--batches` changes it) or
`--workload compute_bound_mlp`. Rounds are interleaved side by side; the figures
are medians over the rounds, each round starting with the next side.

    python benchmarks/one_epoch.py                  # 3 rounds, tutorial MLP
    python benchmarks/one_epoch.py --quick          # 1 round, 60 batches

The parent process never imports JAX (on a TPU machine only one process can open the
chip): the banner's backend is the one the first child reports.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

from _common import (
    WORKLOADS,
    BannerOnce,
    backend_info,
    make_experiment,
    run_child_json,
    synthetic_batches,
)

BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"


def _reference(widths: tuple[int, ...], batches: list[dict]) -> None:
    """The hand-written loop over one epoch (`throughput.py`'s), from its
    parameters' initialization to the last loss on the host."""
    from throughput import reference_loop

    run_epochs, first_step = reference_loop(widths, batches)
    first_step()  # the parameters, `tx.init` and batch 0
    if len(batches) > 1:
        run_epochs(1, start=1)  # the epoch's other batches


def _jaxnitro(
    widths: tuple[int, ...], batches: list[dict], per_call: str, run_dir: str
) -> int | None:
    """One epoch through jaxnitro at `per_call` ("auto": no keyword); the count
    "auto" chose, when it chose one."""
    import jaxnitro as nx

    exp = make_experiment(widths, batches)
    keywords: dict[str, Any] = {"run_dir": run_dir, "checkpointer": None}
    if per_call != "auto":
        keywords["steps_per_call"] = int(per_call)
    nitro = nx.Nitro(exp(max_epochs=1), **keywords)
    nitro.train()
    return nitro.status.auto_steps_per_call


def measure(name: str, count: int, side: str) -> dict[str, Any]:
    """One side's run in this process: seconds, programs compiled, the backend."""
    import jax

    if side != "reference":
        import jaxnitro  # noqa: F401  (its import is outside the clock)
    import optax  # noqa: F401

    jax.numpy.zeros(1).block_until_ready()  # the backend's start-up, common to all
    widths, batch, _ = WORKLOADS[name]
    batches = synthetic_batches(batch, count)
    compiled: list[float] = []

    def listen(event: str, seconds: float, **_: Any) -> None:
        if event == BACKEND_COMPILE:
            compiled.append(seconds)

    jax.monitoring.register_event_duration_secs_listener(listen)
    chosen = None
    with tempfile.TemporaryDirectory(prefix="nitro-one-epoch-") as run_dir:
        start = time.perf_counter()
        if side == "reference":
            _reference(widths, batches)
        else:
            chosen = _jaxnitro(widths, batches, side, run_dir)
        seconds = time.perf_counter() - start
    return {
        "seconds": seconds,
        "programs": len(compiled),
        "compile_seconds": sum(compiled),
        "chosen": chosen,
        "backend": backend_info(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="1 round, 60 batches")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--batches", type=int, help="batches in the epoch")
    parser.add_argument("--steps-per-call", type=int, default=8, metavar="K")
    parser.add_argument("--workload", choices=list(WORKLOADS), default="tutorial_mlp")
    parser.add_argument("--internal", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.internal:
        name, count, side = args.internal
        print(json.dumps(measure(name, int(count), side)))
        return
    rounds = args.rounds or (1 if args.quick else 3)
    count = args.batches or (60 if args.quick else 550)
    if rounds < 1 or count < 1:
        parser.error("--rounds and --batches take a positive count")
    k = args.steps_per_call
    sides = {
        "reference": "hand-written loop",
        "1": "jaxnitro k=1",
        str(k): f"jaxnitro k={k}",
        "auto": "jaxnitro, no keyword",
    }
    env = dict(os.environ, JAXNITRO_COMPILATION_CACHE="off")
    show_banner = BannerOnce()
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    order = list(sides)
    for round_ in range(rounds):
        # Each round starts with another side, so none always runs first.
        shift = round_ % len(order)
        for side in order[shift:] + order[:shift]:
            out = run_child_json(
                [__file__, "--internal", args.workload, str(count), side], env
            )
            show_banner(out["backend"])
            runs[side].append(out)
    seconds = {
        side: statistics.median(r["seconds"] for r in runs[side]) for side in sides
    }
    print(
        f"{args.workload}, one epoch of {count} steps in a fresh process, compile "
        f"included (median of {rounds} rounds):"
    )
    for side, label in sides.items():
        last = runs[side][-1]
        n = last["chosen"]
        chosen = f"; chose {n} step{'s' * (n != 1)} a call" if n else ""
        print(
            f"  {label:22s} {seconds[side]:7.3f} s  {count / seconds[side]:8.1f} "
            f"steps/s  {seconds['reference'] / seconds[side]:.3f}x of the "
            f"hand-written loop  {last['programs']} programs compiled "
            f"({last['compile_seconds']:.2f} s){chosen}"
        )
    print(
        f"{args.workload} one epoch: k={k} over k=1 "
        f"{seconds['1'] / seconds[str(k)]:.3f}x, no keyword over k=1 "
        f"{seconds['1'] / seconds['auto']:.3f}x (above 1: faster)"
    )


if __name__ == "__main__":
    sys.exit(main())
