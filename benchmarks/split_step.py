"""What splitting one training step into two programs costs, on this machine.

../shared/DESIGN.md, section 3, measured about 5% for a gradient program feeding a
separate optimizer program. This measures it again, side by side in one process, on
the tutorial-sized MLP (dispatch-bound) and a compute-bound one: a fused program
(gradient and RAdam update in one executable, what jaxnitro runs at accum == 1)
against the split pair, each with the loss read back one step late as the training
loop does.

    python benchmarks/split_step.py
    python benchmarks/split_step.py --cores 1   # pinned to one core
    python benchmarks/split_step.py --reps 3    # fewer repetitions

On several cores XLA's CPU runtime runs a program's independent kernels side by side,
so inside the fused step the update's kernels overlap the backward pass; `--cores 1`
takes that away and shows what the second program costs by itself.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

import jax
import numpy as np
import optax
from _common import (
    WORKLOADS,
    apply,
    banner,
    cross_entropy,
    init_params,
    synthetic_batches,
)


def measure(name: str, reps: int = 15) -> tuple[float, ...]:
    widths, batch, count = WORKLOADS[name]
    batches = synthetic_batches(batch, count)
    hp = {"learning_rate": np.float32(1e-3)}

    def objective(p, b):
        return cross_entropy(apply(p, b["x"]), b["y"])

    def fused(p, o, b, hp):
        loss, g = jax.value_and_grad(objective)(p, b)
        u, o = optax.radam(hp["learning_rate"]).update(g, o, p)
        return optax.apply_updates(p, u), o, loss

    def gradient(p, b):
        loss, g = jax.value_and_grad(objective)(p, b)
        return g, loss

    def optimizer(p, o, g, hp):
        u, o = optax.radam(hp["learning_rate"]).update(g, o, p)
        return optax.apply_updates(p, u), o

    params = init_params(widths)
    state = optax.radam(1e-3).init(params)
    one = jax.jit(fused, donate_argnums=(0, 1)).lower(params, state, batches[0], hp)
    one = one.compile()
    grad = jax.jit(gradient).lower(params, batches[0]).compile()
    opt = jax.jit(optimizer, donate_argnums=(0, 1)).lower(params, state, params, hp)
    opt = opt.compile()
    carry = [
        jax.tree.map(jax.numpy.array, params),
        jax.tree.map(jax.numpy.array, state),
    ]

    def run_fused():
        previous = None
        for b in batches:
            carry[0], carry[1], loss = one(carry[0], carry[1], b, hp)
            if previous is not None:
                float(previous)
            previous = loss
        float(previous)

    def run_split():
        previous = None
        for b in batches:
            g, loss = grad(carry[0], b)
            carry[0], carry[1] = opt(carry[0], carry[1], g, hp)
            if previous is not None:
                float(previous)
            previous = loss
        float(previous)

    # What the update adds inside the fused step: each step read back at once, since
    # gradient-only steps do not depend on each other and would otherwise overlap.
    def run_fused_synchronous():
        for b in batches:
            carry[0], carry[1], loss = one(carry[0], carry[1], b, hp)
            float(loss)

    def run_gradient_synchronous():
        for b in batches:
            float(grad(carry[0], b)[1])

    runs = [
        ("fused", run_fused),
        ("split", run_split),
        ("fused_sync", run_fused_synchronous),
        ("gradient_sync", run_gradient_synchronous),
    ]
    order = [run_name for run_name, _ in runs]  # what the caller unpacks
    times: dict[str, list[float]] = {run_name: [] for run_name in order}
    for _, run in runs:
        run()  # warm
    for _ in range(reps):
        random.shuffle(runs)  # the timing order; the result keeps `order`
        for run_name, run in runs:
            start = time.perf_counter()
            run()
            times[run_name].append(time.perf_counter() - start)
    return tuple(statistics.median(times[run_name]) for run_name in order)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cores", type=int, help="pin the process to this many cores")
    parser.add_argument("--reps", type=int, default=15, help="timed epochs a variant")
    args = parser.parse_args()
    cores = args.cores
    if cores is not None:
        # XLA sizes its CPU thread pool from the affinity when the backend starts,
        # which is at the first `jax.devices()` (in `banner()`), after this.
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:cores])
    print(banner())
    for name in WORKLOADS:
        fused, split, fused_sync, gradient_sync = measure(name, args.reps)
        print(
            f"{name}: s/epoch fused {fused:.4f}, split {split:.4f}; the split costs "
            f"{100 * (split / fused - 1):.1f}%. Read back every step: fused "
            f"{fused_sync:.4f}, the gradient program alone {gradient_sync:.4f}; the "
            f"update adds {100 * (fused_sync / gradient_sync - 1):.1f}% inside the "
            f"fused step"
        )


if __name__ == "__main__":
    main()
