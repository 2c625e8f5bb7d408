"""`gpt`'s `attention="flash"`: causal self-attention through the Pallas TPU flash
attention kernel for sparse masks, "splash"
(`jax.experimental.pallas.ops.tpu.splash_attention`), which skips the blocks above
the causal diagonal where the dense flash kernel
(`jax.experimental.pallas.ops.tpu.flash_attention`) masks them.

The kernel takes q, k and v as [heads, time, head_dim], where
`nn_modules.Attention` holds them [batch, time, heads, head_dim]: every example's
heads become the kernel's heads. It tiles the sequence in blocks of a multiple of
FLASH_TILE positions, so a time that is not a multiple of it is padded at the end
and the padding cut off again: causal attention lets no real position see a later
one, so the padding changes no real output and receives no gradient. The kernel
computes the scores, the softmax statistics and the weighted sum in float32
whatever the inputs' dtype (a bf16 run's q, k and v stay bf16 in memory), returns
the inputs' dtype, and differentiates through its own backward kernel (a
`jax.custom_vjp`). XLA cannot partition the kernel across devices, so in a program
over several devices (data parallelism) each device runs it on its own examples, a
`jax.shard_map` over the batch.

The kernel compiles for a TPU only: Pallas lowers it through Mosaic, and on any other
backend the lowering fails. The fronts refuse it off a TPU when they build a model's
parameters (`nn_attention.check_attention_backend`), before anything compiles.

Pallas's TPU interpret mode (`jax.experimental.pallas.tpu.force_tpu_interpret_mode`)
runs the kernel on a CPU, slowly; the tests compare it with the XLA attention there.
It is never chosen for a user.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

FLASH_TILE = 128
"""The sequence is padded to a multiple of this: the kernel's tiles are multiples of
the TPU's 128 lanes."""

FLASH_BLOCKS = (512, 256, 128)
"""The kernel's block along the sequence, for the queries and the keys, forward and
backward: the largest of these that divides the padded time. Measured on a TPU v5e
(2026-12-07, GPT-2 small's attention: batch 16 x 1024, 12 heads of 64, bf16, the
forward and backward passes): blocks of 512 with the fused backward kernel 4.37-4.45
ms, of 1024 4.33 ms; in two backward kernels, blocks of 512 5.07 ms, of 256 7.97, of
128 18.5; the dense flash kernel 6.92-7.00 ms at its best blocks (17.98 at its
default of 128); the attention written out in JAX 6.89-6.97 ms."""

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
    mesh = jax.typeof(q).sharding.mesh
    # Axes a shard_map around this call already maps are per device here.
    axes = tuple(a for a in mesh.axis_names if a not in mesh.manual_axes)
    devices = math.prod(mesh.shape[a] for a in axes)
    if devices <= 1:
        return splash_on_one_device(q, k, v)
    # XLA cannot partition a Mosaic kernel across devices (the lowering refuses
    # it), so under data parallelism each device runs it on its own examples:
    # the batch split over every axis of the program's mesh, the heads whole. A
    # batch the devices cannot share evenly (a prediction of one example) runs
    # whole on each.
    shared = q.shape[0] % devices == 0
    split = PartitionSpec(axes) if shared else PartitionSpec()
    per_device = jax.shard_map(
        splash_on_one_device,
        mesh=mesh,
        in_specs=(split, split, split),
        out_specs=split,
        check_vma=False,
    )
    return per_device(q, k, v)


def splash_on_one_device(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    block: int | None = None,
    fused: bool = True,
) -> jax.Array:
    """`flash_causal_attention` on one device's examples. `block` (a multiple of
    FLASH_TILE dividing the padded time; by default the largest of FLASH_BLOCKS
    that does) and `fused` (the backward pass in one kernel, else two) choose the
    kernel: `benchmarks/attention.py` times the others."""
    batch, time, heads, head_dim = q.shape
    padded = -(-time // FLASH_TILE) * FLASH_TILE
    if block is None:
        block = next(b for b in FLASH_BLOCKS if padded % b == 0)
    kernel = _splash_kernel(padded, batch * heads, block, fused)

    def rows(x: jax.Array) -> jax.Array:
        """[batch, time, heads, head_dim] -> [batch * heads, padded, head_dim]."""
        x = jnp.swapaxes(x, 1, 2).reshape(batch * heads, time, head_dim)
        if padded == time:
            return x
        return jnp.pad(x, ((0, 0), (0, padded - time), (0, 0)))

    # The kernel takes [heads, time, head_dim] and no scale: every example's heads
    # are its heads (a vmap over the batch would add a grid axis that Pallas's
    # interpret mode, the tests' way to run it on a CPU, refuses). Scaled in
    # float32 and rounded once to q's dtype (the kernel's own scaling of the
    # scores, which splash does not offer, rounded nothing).
    scaled = (q.astype(jnp.float32) * (1.0 / head_dim**0.5)).astype(q.dtype)
    mixed = kernel(rows(scaled), rows(k), rows(v))[:, :time]
    return jnp.swapaxes(mixed.reshape(batch, heads, time, head_dim), 1, 2)


@functools.lru_cache(maxsize=16)
def _splash_kernel(time: int, heads: int, block: int, fused: bool) -> Any:
    """The splash kernel of a causal mask over `time` for `heads` heads, one mask
    for all, in blocks of `block`, its backward pass in one kernel when `fused` (dq,
    dk and dv together: 4.37 ms against 5.07 in two kernels, FLASH_BLOCKS): built
    once per shape, its mask's block tables being NumPy work."""
    # Imported here: Pallas is loaded only by a model that traces the kernel
    # ("flash", or "auto", which traces it on every backend and keeps it on a TPU).
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    sizes: dict[str, Any] = dict(
        block_q=block,
        block_kv=block,
        block_kv_compute=block,
        block_q_dkv=block,
        block_kv_dkv=block,
        block_kv_dkv_compute=block,
        use_fused_bwd_kernel=fused,
    )
    if not fused:  # the dq kernel's own blocks
        sizes.update(block_q_dq=block, block_kv_dq=block)
    mask = splash.MultiHeadMask([splash.CausalMask((time, time))] * heads)
    # The kernel holds its mask's tables as arrays: made concrete here, never
    # tracers of the trace that first asked (this kernel outlives it).
    with jax.ensure_compile_time_eval():
        return splash.make_splash_mha_single_device(
            mask, block_sizes=splash.BlockSizes(**sizes)
        )
