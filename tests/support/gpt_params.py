"""The tiny `gpt` the run-file model tests train: its spec, random parameters,
tokens and the next-token loss, shared by the remat, attention and model tests; the
attention kernels' refusals off their backends (`OFF_BACKEND`)."""

from __future__ import annotations

from typing import Any

import jax
import optax
import pytest

from jaxnitro.runfile import nn_cudnn, nn_flash
from jaxnitro.runfile.stdlib_nn import GPTSpec

TINY = GPTSpec(vocab=256, layers=2, dim=64, heads=2, context=64)
"""examples/gpt2.py's tiny configuration."""


def random_params(spec: GPTSpec, seed: int) -> dict[str, jax.Array]:
    """Every parameter random (norm scales and biases too), so that no term hides
    (the attention weights far from uniform)."""
    shapes = spec.parameter_shapes()
    keys = jax.random.split(jax.random.key(seed), len(shapes))
    return {
        name: 0.3 * jax.random.normal(key, shape)
        for key, (name, shape) in zip(keys, shapes.items(), strict=True)
    }


def tokens(batch: int = 4, time: int = 65) -> jax.Array:
    """int32[batch, time] below the tiny vocabulary: inputs then shifted targets."""
    return jax.random.randint(jax.random.key(7), (batch, time), 0, TINY.vocab)


def loss_fn(spec: GPTSpec) -> Any:
    """The mean next-token cross-entropy of `spec` as a function of (params,
    tokens), the run file's objective."""

    def loss(params: Any, tokens: Any) -> Any:
        logits = spec.apply(params, tokens[:, :-1], None)
        return optax.softmax_cross_entropy_with_integer_labels(
            logits, tokens[:, 1:]
        ).mean()

    return loss


def assert_gradients_close(grads: dict[str, Any], expected: dict[str, Any]) -> None:
    """Each gradient of `grads` within 1e-5 of `expected`'s, relative, or 1e-5 of
    that gradient's largest entry (float32 work summed in another order)."""
    import jax.numpy as jnp
    import numpy as np

    assert grads.keys() == expected.keys()
    for name, grad in grads.items():
        want = expected[name]
        scale = float(jnp.abs(want).max())
        np.testing.assert_allclose(
            grad, want, rtol=1e-5, atol=max(1e-5 * scale, 1e-8), err_msg=name
        )


OFF_BACKEND = [
    pytest.param(
        "flash",
        nn_flash,
        "FLASH_BACKENDS",
        "the Pallas TPU flash attention kernel, which compiles for a TPU only",
        "a TPU",
        marks=pytest.mark.skipif(
            jax.default_backend() == "tpu", reason="the kernel compiles on a TPU"
        ),
    ),
    pytest.param(
        "cudnn",
        nn_cudnn,
        "CUDNN_BACKENDS",
        "cuDNN's fused attention, which runs on an NVIDIA GPU only",
        "an NVIDIA GPU",
        marks=pytest.mark.skipif(
            jax.default_backend() == "gpu", reason="cuDNN's attention runs on a GPU"
        ),
    ),
]
"""Each kernel off its backend: its name, its module and the backends' name there,
what its refusal calls it, and where it runs."""
