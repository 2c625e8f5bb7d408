"""Training throughput and time to first step: jaxnitro against a hand-written loop.

Each measurement runs in its own subprocess (cold caches, its own peak-memory reading);
the steady-state throughput of both sides is measured in one process, interleaved, so
machine noise hits both alike. The reference is the floor we measure overhead against:
a hand-written `jax.jit` + Optax loop (RAdam, the rule jaxnitro uses by default) over
the same in-memory batches. Keras 3 on the JAX backend (`fit`, Adam: Keras ships no
RAdam) is measured beside it when `keras` is importable.

    python benchmarks/throughput.py            # both workloads, prints ratios
    python benchmarks/throughput.py --quick    # fewer repetitions
    python benchmarks/throughput.py --quick --workload tutorial_mlp   # one workload

The parent process never imports JAX (on a TPU machine only one process can open the
chip): the banner's backend is the one the first child reports.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time

from _common import (
    WORKLOADS,
    BannerOnce,
    apply,
    backend_info,
    cross_entropy,
    init_params,
    make_experiment,
    paired_ratio,
    run_child_json,
    synthetic_batches,
)


def reference_loop(widths, batches):
    """A hand-written jit + optax loop; returns (run_epochs, first_step)."""
    import jax
    import optax

    tx = optax.radam(1e-3)

    def step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(lambda p: cross_entropy(apply(p, x), y))(
            params
        )
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    jitted = jax.jit(step, donate_argnums=(0, 1))
    state = {}

    def first_step():
        params = init_params(widths)
        state["params"], state["opt"] = params, tx.init(params)
        b = batches[0]
        state["params"], state["opt"], loss = jitted(
            state["params"], state["opt"], b["x"], b["y"]
        )
        loss.block_until_ready()

    def run_epochs(epochs, start=0):  # `start`: an epoch's first batches skipped
        loss = None
        for _ in range(epochs):
            for b in batches[start:]:
                state["params"], state["opt"], loss = jitted(
                    state["params"], state["opt"], b["x"], b["y"]
                )
        loss.block_until_ready()

    return run_epochs, first_step


def keras_fit(widths, batches):
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import keras
    import numpy as np

    x = np.concatenate([b["x"] for b in batches])
    y = np.concatenate([b["y"] for b in batches])
    model = keras.Sequential(
        [keras.Input((widths[0],))]
        + [keras.layers.Dense(w, activation="relu") for w in widths[1:-1]]
        + [keras.layers.Dense(widths[-1])]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.CategoricalCrossentropy(from_logits=True),
        jit_compile=True,
    )
    batch = len(batches[0]["x"])

    def run_epochs(epochs):
        model.fit(x, y, batch_size=batch, epochs=epochs, verbose=0, shuffle=False)

    return run_epochs


def measure_throughput(name: str, reps: int, epochs: int) -> dict:
    """Steady state, in one process, interleaved: seconds per epoch for each side.

    jaxnitro's epochs are timed by the loop itself (the history's `seconds`), and the
    first epoch of each `train()` is dropped: it carries the once-per-call work
    (optimizer-state allocation, the program lookup) that is not steady state.
    """
    import jaxnitro as nx

    widths, batch, count = WORKLOADS[name]
    batches = synthetic_batches(batch, count)
    exp = make_experiment(widths, batches)

    chosen: list[int | None] = []  # the count "auto" chose, handle by handle

    def ours(n_epochs):
        nitro = nx.Nitro(exp(max_epochs=n_epochs + 1), logger=None, checkpointer=None)
        nitro.train()
        chosen.append(nitro.status.auto_steps_per_call)
        return [row["seconds"] for row in nitro.history[2:]]  # epochs 2 on

    def timed(run):
        start = time.perf_counter()
        run(1)
        return time.perf_counter() - start

    ref_epochs, ref_first = reference_loop(widths, batches)
    ref_first()
    ref_epochs(1)
    ours(1)  # compile once; every later handle hits the cache
    sides = {"jaxnitro": [], "reference": []}
    try:
        keras_run = keras_fit(widths, batches)
        keras_run(1)
        sides["keras"] = []
    except ImportError:
        keras_run = None
    for _ in range(reps):  # per-epoch samples, interleaved; medians compared
        sides["jaxnitro"] += ours(epochs)
        sides["reference"] += [timed(ref_epochs) for _ in range(epochs)]
        if keras_run is not None:
            sides["keras"] += [timed(keras_run) for _ in range(epochs)]
    result: dict = {side: statistics.median(times) for side, times in sides.items()}
    # Paired ratios: each epoch of one side against the epoch of the other measured
    # next to it, so a slow stretch of a shared machine cancels out.
    for side in ("jaxnitro", "keras"):
        if side in sides:
            result[f"{side}_paired"] = paired_ratio(sides["reference"], sides[side])
    result["samples_per_epoch"] = batch * count
    result["chosen"] = sorted(set(chosen), key=str)
    result["backend"] = backend_info()
    return result


def measure_first_step(name: str, side: str) -> dict:
    """Cold start in this process: construction to the end of the first step.

    Both clocks start after the imports (jaxnitro or Optax), the backend's start-up
    and the data build, and end with the first step's loss on the host (a one-batch
    epoch: `train()` returns once it is read back). `first_step.py` splits it into
    phases and measures the warm persistent cache too.
    """
    import jax

    if side == "jaxnitro":
        import jaxnitro as nx
    else:
        import optax  # noqa: F401
    widths, batch, _ = WORKLOADS[name]
    batches = synthetic_batches(batch, 1)
    jax.numpy.zeros(1).block_until_ready()  # backend start-up is common to both
    start = time.perf_counter()
    if side == "jaxnitro":
        exp = make_experiment(widths, batches)
        nx.Nitro(exp(max_epochs=1), logger=None, checkpointer=None).train()
    else:
        _, first = reference_loop(widths, batches)
        first()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"seconds": seconds, "peak_rss_mb": peak, "backend": backend_info()}


def subprocess_json(*args: str) -> dict:
    env = dict(os.environ, JAXNITRO_COMPILATION_CACHE="off")
    return run_child_json([__file__, *args], env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--workload", choices=[*WORKLOADS, "all"], default="all")
    parser.add_argument("--internal", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.internal:
        kind, name, *rest = args.internal
        if kind == "throughput":
            out = measure_throughput(name, int(rest[0]), int(rest[1]))
        else:
            out = measure_first_step(name, rest[0])
        print(json.dumps(out))
        return
    # One epoch per side per repetition: the finest interleaving, so a slow minute on
    # a shared machine hits both sides alike.
    reps, epochs = (9, 1) if args.quick else (25, 1)
    show_banner = BannerOnce()  # this process starts no backend: the children do
    for name in list(WORKLOADS) if args.workload == "all" else [args.workload]:
        t = subprocess_json("--internal", "throughput", name, str(reps), str(epochs))
        show_banner(t["backend"])
        line = (
            f"{name}: throughput jaxnitro/reference = "
            f"{t['jaxnitro_paired']:.3f}x paired, "
            f"{t['reference'] / t['jaxnitro']:.3f}x of medians "
            f"(s/epoch: jaxnitro {t['jaxnitro']:.4f}, reference {t['reference']:.4f}"
        )
        if "keras" in t:
            line += f", keras {t['keras']:.4f}); keras/reference "
            line += f"{t['keras_paired']:.3f}x paired"
        else:
            line += ")"
        print(f'{line}; steps_per_call "auto" chose {t["chosen"]}')
        ours = subprocess_json("--internal", "first", name, "jaxnitro")
        ref = subprocess_json("--internal", "first", name, "reference")
        print(
            f"{name}: first step jaxnitro/reference = "
            f"{ours['seconds'] / ref['seconds']:.2f}x "
            f"({ours['seconds']:.2f} s vs {ref['seconds']:.2f} s); peak RSS "
            f"{ours['peak_rss_mb']:.0f} MB vs {ref['peak_rss_mb']:.0f} MB"
        )


if __name__ == "__main__":
    main()
