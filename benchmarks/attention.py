"""One causal attention alone, forward and forward + backward: `gpt`'s attentions and
the Pallas TPU kernels' block sizes, at GPT-2 small's shapes by default.

Rows: the attention written out in JAX (`nn_modules.written_out_attention`,
`:xla`); jaxnitro's `:flash` (`nn_flash.flash_causal_attention`: the splash kernel,
blocks of 512, one fused backward kernel); the same at other blocks and with two
backward kernels; the dense Pallas flash kernel
(`jax.experimental.pallas.ops.tpu.flash_attention`) at blocks of 128, 512 and 1024.
Each row: the median wall time of a jitted forward pass and of a jitted forward and
backward pass (the gradient of a random projection of the output with respect to
q, k and v), and the largest difference of its output from the written-out one.
The Pallas kernels compile for a TPU only: elsewhere their rows are left out, and
the script says so.

    python benchmarks/attention.py            # batch 16 x 1024, 12 heads of 64, bf16
    python benchmarks/attention.py --quick    # batch 2 x 256, 4 heads of 64
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from _common import banner, median_seconds

from jaxnitro.runfile.nn_flash import flash_causal_attention, splash_on_one_device
from jaxnitro.runfile.nn_modules import written_out_attention

Attention = Callable[[Any, Any, Any], Any]


def heads_first(x: jax.Array) -> jax.Array:
    """[batch, time, heads, head_dim] <-> [batch, heads, time, head_dim]."""
    return jnp.swapaxes(x, 1, 2)


def splash(block: int, fused: bool) -> Attention:
    """jaxnitro's `flash` on one device with the splash kernel's blocks `block`
    and its backward pass in one kernel when `fused`, else two."""

    def attend(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return splash_on_one_device(q, k, v, block=block, fused=fused)

    return attend


def dense_flash(block: int) -> Attention:
    """The dense Pallas flash attention kernel, causal, every block `block`."""
    from jax.experimental.pallas.ops.tpu.flash_attention import (
        BlockSizes,
        flash_attention,
    )

    sizes = BlockSizes(
        block_q=block,
        block_k_major=block,
        block_k=block,
        block_b=1,
        block_q_major_dkv=block,
        block_k_major_dkv=block,
        block_k_dkv=block,
        block_q_dkv=block,
        block_k_major_dq=block,
        block_k_dq=block,
        block_q_dq=block,
    )

    def attend(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        mixed = flash_attention(
            heads_first(q),
            heads_first(k),
            heads_first(v),
            causal=True,
            sm_scale=q.shape[3] ** -0.5,
            block_sizes=sizes,
        )
        return heads_first(mixed)

    return attend


def rows(time: int) -> dict[str, Attention]:
    """The kernels' rows whose blocks fit `time` positions."""
    found: dict[str, Attention] = {
        "flash (jaxnitro's: splash, fused)": flash_causal_attention
    }
    for block in (1024, 128):
        if time % block == 0:
            found[f"splash, blocks of {block}, fused"] = splash(block, True)
    if time % 512 == 0:
        found["splash, blocks of 512, two backward"] = splash(512, False)
    for block in (128, 512, 1024):
        if time % block == 0:
            found[f"dense flash, blocks of {block}"] = dense_flash(block)
    return found


def median_ms(fn: Callable[..., Any], args: tuple[Any, ...], reps: int) -> float:
    """The median wall time of `reps` calls of `fn(*args)`, each waited for,
    after three untimed calls (the compile among them)."""

    def call() -> None:
        jax.block_until_ready(fn(*args))

    for _ in range(3):
        call()
    return median_seconds(call, reps) * 1e3


def measure(
    name: str, attend: Attention, inputs: tuple[Any, ...], want: Any, reps: int
) -> None:
    """One row: forward and forward + backward times, and the output's distance
    from the written-out attention's."""
    q, k, v, cotangent = inputs

    def projected(q: Any, k: Any, v: Any) -> Any:
        out = attend(q, k, v).astype(jnp.float32)
        return jnp.sum(out * cotangent.astype(jnp.float32))

    forward = jax.jit(attend)
    backward = jax.jit(jax.grad(projected, argnums=(0, 1, 2)))
    out = forward(q, k, v)
    gap = float(jnp.max(jnp.abs(out.astype(jnp.float32) - want)))
    ahead = median_ms(forward, (q, k, v), reps)
    both = median_ms(backward, (q, k, v), reps)
    print(
        f"  {name:38s} forward {ahead:8.3f} ms   forward + backward {both:8.3f} ms"
        f"   largest difference from xla {gap:.3g}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a small attention")
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    batch, time_, heads, head_dim = (
        (2, 256, 4, 64) if args.quick else (16, 1024, 12, 64)
    )
    print(banner())
    keys = jax.random.split(jax.random.key(0), 4)
    shape = (batch, time_, heads, head_dim)
    inputs = tuple(jax.random.normal(key, shape, jnp.bfloat16) for key in keys)
    print(
        f"causal attention, batch {batch} x {time_}, {heads} heads of {head_dim}, "
        f"bf16: the median of {args.reps} calls"
    )
    want = jax.jit(written_out_attention)(*inputs[:3]).astype(jnp.float32)
    measure("xla (written out)", written_out_attention, inputs, want, args.reps)
    if jax.default_backend() != "tpu":
        print(
            f"  the Pallas kernels' rows left out: they compile for a TPU only, and "
            f"this backend is {jax.default_backend()!r}"
        )
        return
    for name, attend in rows(time_).items():
        measure(name, attend, inputs, want, args.reps)


if __name__ == "__main__":
    main()
