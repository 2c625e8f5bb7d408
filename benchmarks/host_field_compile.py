"""Compile time with a dataset-sized Host field on the experiment, against none.

The tracer sees `compile_view(e)`, in which every Host field is a `StrippedHost`
sentinel, so a 200 MB array held on the experiment should add nothing to a compile.
Each repetition empties the compile cache and times setup plus the first training step
(which compiles the gradient and optimizer programs), alternating the two experiments.

    python benchmarks/host_field_compile.py
    python benchmarks/host_field_compile.py --reps 2    # fewer compiles
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("JAXNITRO_COMPILATION_CACHE", "off")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import banner  # noqa: E402

import jaxnitro as nx  # noqa: E402

BATCH = [
    {
        "x": np.ones((64, 256), np.float32),
        "y": np.eye(10, dtype=np.float32)[np.arange(64) % 10],
    }
]


class WithHostField(nx.Experiment):
    images: np.ndarray | None = None
    """Dataset-sized, unmarked: Host, stripped from every trace."""

    max_epochs: int = 1

    def build_data(self, dist):
        return {"train": BATCH}

    def build_model(self, rng):
        k1, k2 = jax.random.split(rng)
        return (
            None,
            {
                "w1": jax.random.normal(k1, (256, 512)) * 0.05,
                "w2": jax.random.normal(k2, (512, 10)) * 0.05,
            },
            {},
        )

    def forward(self, model, params, state, *, x):
        return jnp.tanh(x @ params["w1"]) @ params["w2"], state

    def loss(self, logits, *, y):
        return -jnp.mean(jnp.sum(y * jax.nn.log_softmax(logits), -1))


def first_step_seconds(images: np.ndarray | None) -> float:
    nx.compile.cache_reset()
    start = time.perf_counter()
    nx.Nitro(WithHostField(images=images), logger=None, checkpointer=None).train()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7, help="compiles of each side")
    reps = parser.parse_args().reps
    print(banner())
    big = np.random.default_rng(0).random((50_000, 1000), dtype=np.float32)  # 200 MB
    print(f"Host field: {big.nbytes / 2**20:.0f} MB")
    first_step_seconds(None)  # warm up the backend and imports
    with_field, without = [], []
    for _ in range(reps):
        with_field.append(first_step_seconds(big))
        without.append(first_step_seconds(None))
    a, b = statistics.median(with_field), statistics.median(without)
    print(
        f"setup + first step (compiles included): with the Host field {a:.3f} s, "
        f"without {b:.3f} s, ratio {a / b:.3f}"
    )


if __name__ == "__main__":
    main()
