"""The workload pieces the benchmarks share: synthetic data, the MLP, its loss, the
jaxnitro experiment that trains it, and the paired-median ratio they report.

JAX and jaxnitro are imported inside the functions, never at module level:
`throughput.py` imports this module in the subprocess that measures a cold start,
and that import must not start JAX before the clock does.

Run a benchmark as `python benchmarks/<script>.py`: Python puts this folder on
`sys.path`, so `from _common import ...` finds this file.

One process at a time: on a TPU machine only one process can open the chip, and JAX
opens it at the first `jax.devices()`, array operation or `jax.default_backend()`. A
script that measures in child processes (`throughput.py`, `first_step.py`) therefore
never imports JAX in the parent: each child reports its backend (`backend_info()`) in
its JSON output, and the parent prints the banner from that. `run_child_json` checks
the rule before it starts a child.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence

TPU_LOCK_ERROR = "libtpu multi-process lockfile"
"""What a process that opens a TPU chip another process holds dies with."""

PARENT_IMPORTED_JAX = (
    "{script} imported JAX in the process that starts its measuring children. On a "
    "TPU machine only one process can open the chip, so a parent that starts the "
    "backend (jax.devices(), jax.default_backend(), any array operation) makes every "
    "child die with 'Internal error when accessing libtpu multi-process lockfile'. "
    "Keep `import jax` inside the functions the children run, and read the backend "
    "from the children's JSON output (their 'backend' entry)."
)

WORKLOADS = {
    # name: (layer widths, batch size, batches per epoch)
    "tutorial_mlp": ((784, 128, 10), 100, 60),
    "compute_bound_mlp": ((784, 1024, 1024, 10), 256, 12),
}


def synthetic_batches(batch: int, count: int, seed: int = 0) -> list[dict]:
    """`count` batches of `batch` random 784-feature rows, one-hot 10-class labels."""
    import numpy as np

    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(count):
        x = rng.normal(size=(batch, 784)).astype(np.float32)
        y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, size=batch)]
        batches.append({"x": x, "y": y})
    return batches


def init_params(widths, seed=0):
    """He-initialized dense layers for `widths`: a list of {"w", "b"} dicts."""
    import jax
    import jax.numpy as jnp

    keys = jax.random.split(jax.random.key(seed), len(widths) - 1)
    return [
        {
            "w": jax.random.normal(k, (a, b)) * (2.0 / a) ** 0.5,
            "b": jnp.zeros((b,)),
        }
        for k, a, b in zip(keys, widths[:-1], widths[1:], strict=True)
    ]


def apply(params, x):
    """The MLP: ReLU between layers, logits out."""
    import jax

    for layer in params[:-1]:
        x = jax.nn.relu(x @ layer["w"] + layer["b"][None, :])
    return x @ params[-1]["w"] + params[-1]["b"][None, :]


def cross_entropy(logits, y):
    """Mean softmax cross-entropy against one-hot (or soft) targets `y`."""
    import jax
    import jax.numpy as jnp

    return -jnp.mean(jnp.sum(y * jax.nn.log_softmax(logits), -1))


def make_experiment(widths, batches):
    """The jaxnitro experiment training the MLP on `batches` (a class to subclass)."""
    import jaxnitro as nx

    class Bench(nx.Experiment):
        max_epochs: int = 1

        def build_data(self, dist):
            return {"train": batches}

        def build_model(self, rng):
            return None, init_params(widths), {}

        def forward(self, model, params, state, *, x):
            return apply(params, x), state

        def loss(self, logits, *, y):
            return cross_entropy(logits, y)

    return Bench


def median_seconds(fn, reps: int) -> float:
    """The median wall time of `reps` calls of `fn` (no warm-up: call it first)."""
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def paired_ratio(reference: Iterable[float], other: Iterable[float]) -> float:
    """The median of reference / other over paired timings (above 1: other is faster).

    Each time of `other` is divided into the `reference` time measured next to it, so
    a slow stretch of a shared machine hits both sides of a pair and cancels out.
    """
    return statistics.median(r / o for r, o in zip(reference, other, strict=True))


def backend_info() -> dict:
    """This process's JAX backend: version, platform, device kind and device count.

    Starts the backend: call it only in the process that measures.
    """
    import jax

    devices = jax.devices()
    return {
        "jax": jax.__version__,
        "platform": devices[0].platform,
        "device_kind": devices[0].device_kind,
        "devices": len(devices),
    }


def banner(info: dict | None = None) -> str:
    """The banner line: JAX version, device kind, platform, devices, usable cores.

    `info` is a child's `backend_info()`; without it, this process's own (which starts
    the backend here).
    """
    info = backend_info() if info is None else info
    count = info["devices"]
    return (
        f"jax {info['jax']} on {info['device_kind']} ({info['platform']}, {count} "
        f"device{'s' if count != 1 else ''}), {len(os.sched_getaffinity(0))} cores"
    )


class BannerOnce:
    """Prints the banner of the first child's backend, once (a parent's banner)."""

    def __init__(self) -> None:
        self.shown = False

    def __call__(self, info: dict) -> None:
        if not self.shown:
            print(banner(info), flush=True)
            self.shown = True


def run_child_json(
    args: Sequence[str], env: dict[str, str], *, retries: int = 2
) -> dict:
    """Run `python args...` and parse the last line of its stdout as JSON.

    Raises RuntimeError (with the child's stderr) if the child fails, and before it
    starts if this process has imported JAX (see PARENT_IMPORTED_JAX). A child that
    found the TPU chip still held (the previous child's process not yet gone) is run
    again after 5 seconds, up to `retries` times.
    """
    if "jax" in sys.modules:
        raise RuntimeError(PARENT_IMPORTED_JAX.format(script=sys.argv[0]))
    attempt = 0
    while True:
        done = subprocess.run(
            [sys.executable, *args], capture_output=True, text=True, env=env
        )
        if done.returncode == 0:
            return json.loads(done.stdout.strip().splitlines()[-1])
        if TPU_LOCK_ERROR not in done.stderr or attempt == retries:
            raise RuntimeError(done.stderr)
        attempt += 1
        time.sleep(5)


COMPILED = re.compile(r"Finished XLA compilation of (.+) in ([0-9.e-]+) sec")
TRACED = re.compile(
    r"Finished tracing (?:\+ transforming )?(.+) for \w+ in ([0-9.e-]+) sec"
)


def jax_compile_log() -> list[tuple[str, str, float, float]]:
    """Each XLA compilation and each trace from now on, as `(kind, program,
    seconds, when it ended)`, kind "compiled" or "traced", the program as JAX
    names it (`jit(train_step)` compiled, `train_step` traced): JAX's own log
    lines (`jax_log_compiles`), kept off stderr."""
    import logging

    import jax

    found: list[tuple[str, str, float, float]] = []

    class Compiled(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            message = record.getMessage()
            for kind, pattern in (("compiled", COMPILED), ("traced", TRACED)):
                match = pattern.search(message)
                if match:
                    seconds, now = float(match.group(2)), time.perf_counter()
                    found.append((kind, match.group(1), seconds, now))

    logger = logging.getLogger("jax")
    logger.addHandler(Compiled())
    logger.propagate = False  # the lines are read here, not printed
    jax.config.update("jax_log_compiles", True)
    return found
