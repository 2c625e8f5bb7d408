"""The workload pieces the benchmarks share: synthetic data, the MLP, its loss, the
jaxnitro experiment that trains it, and the paired-median ratio they report.

JAX and jaxnitro are imported inside the functions, never at module level:
`throughput.py` imports this module in the subprocess that measures a cold start,
and that import must not start JAX before the clock does.

Run a benchmark as `python benchmarks/<script>.py`: Python puts this folder on
`sys.path`, so `from _common import ...` finds this file.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable

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


def paired_ratio(reference: Iterable[float], other: Iterable[float]) -> float:
    """The median of reference / other over paired timings (above 1: other is faster).

    Each time of `other` is divided into the `reference` time measured next to it, so
    a slow stretch of a shared machine hits both sides of a pair and cancels out.
    """
    return statistics.median(r / o for r, o in zip(reference, other, strict=True))
