"""Several optimizer steps per dispatch: jaxnitro at steps_per_call 1 and K against
the hand-written loop, in one process, interleaved, the default logger on.

The reference is `throughput.py`'s: a `jax.jit` + Optax RAdam loop over the same
in-memory batches, one dispatch per step. Beside it, the hand-written scan: the same
step under `jax.lax.scan`, K steps per dispatch over batches it stacks per call (its
tail one step at a time), the most several steps per dispatch can give on this
machine. jaxnitro runs with its default JSON-lines logger (a train line every 50
steps) and no checkpointer; its epochs are timed by the loop itself (the history's
`seconds`; there is no validation here), the first epoch of each train() dropped.
Each repetition times each side in turn (the median of 3 epochs each), so a slow
stretch of the shared machine hits all sides alike; the ratios are medians of
per-repetition ratios (`paired_ratio`). Workloads: the two of `throughput.py` and a
tiny MLP 32-16-10 at batch 16, whose CPU step is all dispatch.

    python benchmarks/steps_per_call.py                      # K=8, every workload
    python benchmarks/steps_per_call.py --steps-per-call 4 --reps 9
    python benchmarks/steps_per_call.py --cores 1         # pinned to one core
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile

from _common import (
    WORKLOADS,
    apply,
    banner,
    cross_entropy,
    init_params,
    make_experiment,
    median_seconds,
    paired_ratio,
    synthetic_batches,
)
from throughput import reference_loop

EPOCHS = 3  # timed per side and repetition; the median is the side's sample

# Beside the two shared workloads, one small enough that a CPU step is all dispatch:
# an MLP 32-16-10 at batch 16, 64 batches an epoch (the first 32 features).
TINY = ((32, 16, 10), 16, 64)


def workload(name: str) -> tuple[tuple[int, ...], list[dict]]:
    """`(widths, batches)` of a named workload."""
    widths, batch, count = TINY if name == "tiny_mlp" else WORKLOADS[name]
    batches = synthetic_batches(batch, count)
    if name == "tiny_mlp":
        batches = [{"x": b["x"][:, : widths[0]], "y": b["y"]} for b in batches]
    return widths, batches


def reference_scan(widths, batches, per_call: int):
    """The hand-written loop with `per_call` steps per dispatch: `run_epoch()`."""
    import jax
    import numpy as np
    import optax

    tx = optax.radam(1e-3)

    def step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(lambda p: cross_entropy(apply(p, x), y))(
            params
        )
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    def scanned(params, opt_state, xs, ys):
        def body(carry, batch):
            params, opt_state, loss = step(*carry, *batch)
            return (params, opt_state), loss

        (params, opt_state), losses = jax.lax.scan(body, (params, opt_state), (xs, ys))
        return params, opt_state, losses

    one = jax.jit(step, donate_argnums=(0, 1))
    many = jax.jit(scanned, donate_argnums=(0, 1))
    params = init_params(widths)
    state = {"params": params, "opt": tx.init(params)}
    whole = len(batches) - len(batches) % per_call

    def run_epoch():
        p, o, loss = state["params"], state["opt"], None
        for i in range(0, whole, per_call):
            group = batches[i : i + per_call]
            xs = np.stack([b["x"] for b in group])
            ys = np.stack([b["y"] for b in group])
            p, o, loss = many(p, o, xs, ys)
        for b in batches[whole:]:
            p, o, loss = one(p, o, b["x"], b["y"])
        state["params"], state["opt"] = p, o
        loss.block_until_ready()

    return run_epoch


VARIANTS = {
    "unpacked": "its state passed leaf by leaf (what packing it gains or costs)",
    "no read-ahead": "each epoch reading its own first block (`loop/read_ahead.py`: "
    "on an accelerator an epoch reads the next one's while it ends)",
    "packed each step": "a state of up to 64 MB packed around each step, as a CPU "
    "packs one of up to 256 KB (off a CPU the default packs around the call)",
    "one-batch blocks": "at one step a call, each batch a block of its own, handed "
    "to the program as host arrays (a CPU stacks batches under 64 KB into blocks "
    "of 8 placed once, `loop/blocks.py`)",
}
"""The jaxnitro variants a run may add, each at K=1 and K (`compile/packed.py`)."""


def measure(
    name: str, per_call: int, reps: int, scratch: str, variants: tuple[str, ...] = ()
) -> dict[str, float]:
    """Seconds per epoch of the reference and of jaxnitro at 1 and `per_call`, and
    the paired ratios reference / jaxnitro; each of `variants` (`VARIANTS`) adds
    jaxnitro at both again, changed so. jaxnitro's run directories (its logs) go
    in the folder `scratch`."""
    import jaxnitro as nx
    import jaxnitro.loop.assembly as assembly_module
    import jaxnitro.loop.calls as calls_module
    import jaxnitro.run.training as training_module
    from jaxnitro.compile.packed import PACK_MOST_BYTES, PackRule

    packs = calls_module.pack_rule
    read_ahead = training_module.ReadAhead
    direct = assembly_module.CPU_DIRECT_BATCH_BYTES
    changes = {  # variant: (the packing rule, the read-ahead, a CPU's direct bytes)
        "": (packs, read_ahead, direct),
        "unpacked": (lambda: None, read_ahead, direct),
        "no read-ahead": (packs, lambda: None, direct),
        "packed each step": (
            lambda: PackRule(PACK_MOST_BYTES, each_step=True),
            read_ahead,
            direct,
        ),
        "one-batch blocks": (packs, read_ahead, 0),
    }

    widths, batches = workload(name)
    exp = make_experiment(widths, batches)

    def ours(k: int, variant: str = "") -> float:
        run_dir = tempfile.mkdtemp(dir=scratch)
        nitro = nx.Nitro(
            exp(max_epochs=1 + EPOCHS),
            run_dir=run_dir,
            checkpointer=None,
            steps_per_call=k,
        )
        (
            calls_module.pack_rule,
            training_module.ReadAhead,
            assembly_module.CPU_DIRECT_BATCH_BYTES,
        ) = changes[variant]
        try:
            nitro.train()
        finally:
            calls_module.pack_rule, training_module.ReadAhead = packs, read_ahead
            assembly_module.CPU_DIRECT_BATCH_BYTES = direct
        # Epochs 2 on (the history slices by epoch number): the first carries the
        # once-per-train() work.
        return statistics.median(row["seconds"] for row in nitro.history[2:])

    ref_epochs, ref_first = reference_loop(widths, batches)
    ref_first()
    ref_epochs(1)

    scan_epoch = reference_scan(widths, batches, per_call)
    scan_epoch()

    def timed(run) -> float:
        return median_seconds(run, EPOCHS)

    ours_sides = {
        f"k={k}{' ' + variant if variant else ''}": (k, variant)
        for variant in ("", *variants)
        for k in (1, per_call)
    }
    sides: dict[str, list[float]] = {"reference": [], "reference scan": []}
    sides.update({side: [] for side in ours_sides})
    for k, variant in ours_sides.values():  # compile once: later handles hit the cache
        ours(k, variant)
    for _ in range(reps):
        sides["reference"].append(timed(lambda: ref_epochs(1)))
        sides["reference scan"].append(timed(scan_epoch))
        for side, (k, variant) in ours_sides.items():
            sides[side].append(ours(k, variant))
    result = {side: statistics.median(times) for side, times in sides.items()}
    for side in sides:
        if side == "reference":
            continue
        result[f"{side} paired"] = paired_ratio(sides["reference"], sides[side])
    result[f"k={per_call} / k=1 paired"] = paired_ratio(
        sides["k=1"], sides[f"k={per_call}"]
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps-per-call", type=int, default=8)
    parser.add_argument("--reps", type=int, default=21)
    parser.add_argument("--cores", type=int, help="pin the process to this many cores")
    parser.add_argument(
        "--workload", choices=[*sorted(WORKLOADS), "tiny_mlp"], action="append"
    )
    parser.add_argument(
        "--unpacked", action="store_true", help="also: " + VARIANTS["unpacked"]
    )
    parser.add_argument(
        "--no-read-ahead",
        action="store_true",
        help="also: " + VARIANTS["no read-ahead"],
    )
    parser.add_argument(
        "--packed-each-step",
        action="store_true",
        help="also: " + VARIANTS["packed each step"],
    )
    parser.add_argument(
        "--one-batch-blocks",
        action="store_true",
        help="also: " + VARIANTS["one-batch blocks"],
    )
    args = parser.parse_args()
    if args.cores is not None:
        # XLA sizes its CPU thread pool from the affinity when the backend starts,
        # at the first `jax.devices()` (in `banner()`).
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[: args.cores])
    print(banner())
    k = args.steps_per_call
    flags = (
        args.unpacked,
        args.no_read_ahead,
        args.packed_each_step,
        args.one_batch_blocks,
    )
    variants = tuple(v for v, on in zip(VARIANTS, flags, strict=True) if on)
    for name in args.workload or [*WORKLOADS, "tiny_mlp"]:
        with tempfile.TemporaryDirectory(prefix="nitro-spc-") as scratch:
            r = measure(name, k, args.reps, scratch, variants)
        print(
            f"{name}: speed over the reference, paired: jaxnitro k=1 "
            f"{r['k=1 paired']:.3f}x, k={k} {r[f'k={k} paired']:.3f}x, hand-written "
            f"scan k={k} {r['reference scan paired']:.3f}x; jaxnitro k={k} over k=1 "
            f"{r[f'k={k} / k=1 paired']:.3f}x (s/epoch medians: reference "
            f"{r['reference']:.4f}, scan {r['reference scan']:.4f}, k=1 "
            f"{r['k=1']:.4f}, k={k} {r[f'k={k}']:.4f})"
        )
        for variant in variants:
            one, many = f"k=1 {variant}", f"k={k} {variant}"
            print(
                f"{name}: {variant}: k=1 {r[one + ' paired']:.3f}x, k={k} "
                f"{r[many + ' paired']:.3f}x (s/epoch medians {r[one]:.4f}, "
                f"{r[many]:.4f})"
            )


if __name__ == "__main__":
    main()
