"""`gpt`'s `attention="cudnn"`: causal self-attention through cuDNN's fused
attention, `jax.nn.dot_product_attention(..., implementation="cudnn")`.

cuDNN's fused kernel (a flash attention) works through the sequence in tiles and
never holds the [batch, heads, time, time] scores in memory, forward or backward;
it takes q, k and v as `nn_modules.Attention` holds them, [batch, time, heads,
head_dim], scales the scores by 1 / sqrt(head_dim) and masks the later positions
(`is_causal`), as the written-out attention does. It runs on an NVIDIA GPU only,
and takes bfloat16 or float16 inputs only: a float32 run is refused when its
program is traced (`CUDNN_FLOAT32`), naming the fixes. The fronts refuse it off a
GPU when they build a model's parameters (`nn_attention.check_attention_backend`),
before anything compiles. JAX traces it only where cuDNN is found, so a CPU cannot
run it, even slowly; the tests check the call it makes against the written-out
attention through a stand-in for JAX's function.

A trace that reads only shapes (a run file's `check`, its graph key) runs anywhere,
before any backend starts: under `shapes_only()` the attention traces as JAX's
written-out form, which gives the same shapes and dtype.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import jax
import jax.numpy as jnp

CUDNN_BACKENDS: tuple[str, ...] = ("gpu", "cuda")
"""The JAX backends cuDNN's fused attention runs on: JAX's default on an NVIDIA GPU
("gpu"), or CUDA pinned by name (`setup_devices(backend="cuda")`)."""

CUDNN_OFF_GPU = (
    '{owner} is "cudnn": cuDNN\'s fused attention, which runs on an NVIDIA GPU '
    "only, and this run's JAX backend is {backend!r}. Pass {fix} (the same "
    "attention written out in JAX, which XLA compiles on any backend), or run on an "
    "NVIDIA GPU."
)
"""The message of "cudnn" off a GPU; `owner` names the field or argument, `fix` the
same setting with "xla"."""

CUDNN_FLOAT32 = (
    'attention "cudnn" is cuDNN\'s fused attention, which takes bfloat16 or float16 '
    "inputs, and this run computes its attention in {dtype}. Train in bfloat16 "
    '(precision="bf16", or `:precision :bf16` in a run file), or use the attention '
    'written out in JAX ("xla"), which takes any dtype.'
)
"""The refusal of "cudnn" in a run that computes in float32, raised as its program
is traced."""

CUDNN_DTYPES = (jnp.bfloat16, jnp.float16)
"""The input dtypes cuDNN's fused attention takes."""


_SHAPES_ONLY: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "cudnn_shapes_only", default=False
)


@contextlib.contextmanager
def shapes_only() -> Iterator[None]:
    """Within it "cudnn" traces as JAX's written-out attention: for a trace that
    reads only shapes and dtypes, which must run where cuDNN is not found."""
    token = _SHAPES_ONLY.set(True)
    try:
        yield
    finally:
        _SHAPES_ONLY.reset(token)


def cudnn_causal_attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """Causal softmax attention of q, k, v [batch, time, heads, head_dim] (one
    dtype, bfloat16 or float16) -> [batch, time, heads, head_dim] in that dtype,
    each position attending to itself and the positions before it, the scores
    scaled by 1 / sqrt(head_dim).

    Raises:
        ValueError: CUDNN_FLOAT32, for inputs of any other dtype.
    """
    if _SHAPES_ONLY.get():  # the same shapes and dtype, traced anywhere
        return jax.nn.dot_product_attention(
            q, k, v, is_causal=True, implementation="xla"
        )
    if q.dtype not in CUDNN_DTYPES:
        raise ValueError(CUDNN_FLOAT32.format(dtype=q.dtype))
    return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
