"""Which part of jaxnitro's one-step train program costs its XLA compile, against
the hand-written step's, in one process.

On a TPU v5e the tutorial MLP's train step compiled in 0.78 s against the
hand-written `jax.jit` step's 0.44-0.49 s (2026-12-07), where XLA:CPU compiles the two
in about the same time; the state passed leaf by leaf (not packed) was 0.69 s. Each
variant here undoes one of jaxnitro's parts, trains one step in a fresh handle with
the compile caches emptied (jaxnitro's and JAX's in-process ones; the script turns
the persistent cache off) and reports the train program's compile seconds from
JAX's own log lines (`jax_log_compiles`):

- packed: the state in flat buffers, one per dtype, as jaxnitro passes a small
  state off a CPU (`compile/packed.py`: unpacked and packed around the call);
- unpacked: the state passed leaf by leaf, as a larger state;
- each again with the step's loss not written into the loss ring, so that XLA
  drops the loss's own computation (what the ring and the reported loss cost);
- hand-written step: `throughput.py`'s reference, compiled fresh each time.

    python benchmarks/compile_parts.py --reps 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from collections.abc import Callable
from typing import Any

from _common import (
    WORKLOADS,
    banner,
    jax_compile_log,
    make_experiment,
    synthetic_batches,
)
from throughput import reference_loop


def unused_loss(ring: Any, *_: Any) -> Any:
    """`_record_losses` that writes nothing: the ring goes out as it came in."""
    return ring


def measure(name: str, reps: int) -> dict[str, list[float]]:
    """Each variant's train-program compile seconds, `reps` times, interleaved."""
    import jax

    import jaxnitro as nx
    import jaxnitro.compile.scanned as scanned
    import jaxnitro.loop.calls as calls
    from jaxnitro.compile.cache import cache_reset
    from jaxnitro.compile.packed import ACCELERATOR_PACKING

    compiled = jax_compile_log()
    record, packs = scanned._record_losses, calls.pack_rule
    variants: dict[str, dict[str, Callable[..., Any]]] = {
        "packed": {"packs": lambda: ACCELERATOR_PACKING},
        "unpacked": {"packs": lambda: None},
        "packed, no loss ring write": {
            "packs": lambda: ACCELERATOR_PACKING,
            "record": unused_loss,
        },
        "unpacked, no loss ring write": {"packs": lambda: None, "record": unused_loss},
    }
    widths, batch, _ = WORKLOADS[name]
    batches = synthetic_batches(batch, 1)
    exp = make_experiment(widths, batches)

    def fresh(program: str, run: Callable[[], None]) -> float:
        cache_reset()
        jax.clear_caches()
        compiled.clear()
        run()
        return sum(
            seconds
            for kind, name, seconds, _ in compiled
            if kind == "compiled" and name == program
        )

    def ours(variant: dict[str, Callable[..., Any]]) -> None:
        scanned._record_losses = variant.get("record", record)
        calls.pack_rule = variant.get("packs", packs)
        try:
            with tempfile.TemporaryDirectory(prefix="nitro-parts-") as run_dir:
                nitro = nx.Nitro(
                    exp(max_epochs=1),
                    run_dir=run_dir,
                    logger=None,
                    checkpointer=None,
                    steps_per_call=1,
                )
                nitro.train()
        finally:
            scanned._record_losses, calls.pack_rule = record, packs

    def reference() -> None:
        _, first = reference_loop(widths, batches)
        first()

    times: dict[str, list[float]] = {key: [] for key in [*variants, "hand-written"]}
    for _ in range(reps):
        for key, variant in variants.items():
            times[key].append(fresh("jit(train_step)", lambda v=variant: ours(v)))
        times["hand-written"].append(fresh("jit(step)", reference))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="tutorial_mlp")
    args = parser.parse_args()
    # Every compile is a fresh one: no program read back from disk.
    os.environ["JAXNITRO_COMPILATION_CACHE"] = "off"
    import jax

    jax.config.update("jax_enable_compilation_cache", False)
    print(banner())
    times = measure(args.workload, args.reps)
    print(
        f"{args.workload}: the step program's XLA compile seconds, median of "
        f"{args.reps} (each run):"
    )
    for key, values in times.items():
        each = ", ".join(f"{v:.3f}" for v in values)
        print(f"  {key:30s} {statistics.median(values):.3f} s  ({each})")


if __name__ == "__main__":
    main()
