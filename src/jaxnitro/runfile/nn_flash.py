"""`gpt`'s `attention="flash"`: causal self-attention through the Pallas TPU flash
attention kernel (`jax.experimental.pallas.ops.tpu.flash_attention`).

The kernel takes q, k and v heads first, [batch, heads, time, head_dim], where
`nn_modules.Attention` holds them [batch, time, heads, head_dim]. It tiles the
sequence in blocks of FLASH_BLOCK positions, so a time that is not a multiple of it
is padded at the end and the padding cut off again: causal attention lets no real
position see a later one, so the padding changes no real output and receives no
gradient. The kernel computes the scores, the softmax statistics and the weighted
sum in float32 whatever the inputs' dtype (a bf16 run's q, k and v stay bf16 in
memory), returns the inputs' dtype, and differentiates through its own backward
kernels (a `jax.custom_vjp`).

The kernel compiles for a TPU only: Pallas lowers it through Mosaic, and on any other
backend the lowering fails. The fronts refuse it off a TPU when they build a model's
parameters (`nn_attention.check_attention_backend`), before anything compiles.

Pallas's TPU interpret mode (`jax.experimental.pallas.tpu.force_tpu_interpret_mode`)
runs the kernel on a CPU, slowly; the tests compare it with the XLA attention there.
It is never chosen for a user.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

FLASH_BLOCK = 128
"""The kernel's tile along the sequence, for the queries and the keys, forward and
backward: its own default block sizes (`BlockSizes.get_default`), passed explicitly
so that the padding here always matches them."""

FLASH_BACKENDS: tuple[str, ...] = ("tpu",)
"""The JAX backends the kernel compiles for."""

FLASH_OFF_TPU = (
    '{owner} is "flash": the Pallas TPU flash attention kernel, which compiles for a '
    "TPU only, and this run's JAX backend is {backend!r}. Pass {fix} (the same "
    "attention written out in JAX, which XLA compiles on any backend), or run on a "
    "TPU."
)
"""The message of "flash" off a TPU; `owner` names the field or argument, `fix` the
same setting with "xla"."""


def flash_causal_attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """Causal softmax attention of q, k, v [batch, time, heads, head_dim] (one
    dtype, float32 or bfloat16) -> [batch, time, heads, head_dim] in that dtype,
    each position attending to itself and the positions before it, the scores
    scaled by 1 / sqrt(head_dim).

    Examples:
        >>> import jax.numpy as jnp
        >>> from jax.experimental.pallas import tpu as pltpu
        >>> q = jnp.ones((1, 8, 2, 4))
        >>> with pltpu.force_tpu_interpret_mode():  # a CPU runs the kernel so
        ...     out = jax.jit(flash_causal_attention)(q, q, q)
        >>> out.shape
        (1, 8, 2, 4)
    """
    # Imported here: Pallas is loaded only by a model that chose the kernel.
    from jax.experimental.pallas.ops.tpu.flash_attention import (
        BlockSizes,
        flash_attention,
    )

    time, head_dim = q.shape[1], q.shape[3]
    padded = -(-time // FLASH_BLOCK) * FLASH_BLOCK
    blocks = BlockSizes(
        block_q=FLASH_BLOCK,
        block_k_major=FLASH_BLOCK,
        block_k=FLASH_BLOCK,
        block_b=1,
        block_q_major_dkv=FLASH_BLOCK,
        block_k_major_dkv=FLASH_BLOCK,
        block_k_dkv=FLASH_BLOCK,
        block_q_dkv=FLASH_BLOCK,
        block_k_major_dq=FLASH_BLOCK,
        block_k_dq=FLASH_BLOCK,
        block_q_dq=FLASH_BLOCK,
    )

    def heads_first(x: jax.Array) -> jax.Array:
        x = jnp.swapaxes(x, 1, 2)
        if padded == time:
            return x
        return jnp.pad(x, ((0, 0), (0, 0), (0, padded - time), (0, 0)))

    mixed = flash_attention(
        heads_first(q),
        heads_first(k),
        heads_first(v),
        causal=True,
        sm_scale=1.0 / head_dim**0.5,
        block_sizes=blocks,
    )
    return jnp.swapaxes(mixed[:, :, :time], 1, 2)
