"""A direct computation of the run file's `gpt` in plain JAX, the reference the Flax
NNX model (`jaxnitro.runfile.nn_modules.GPT`) is compared with: the same
parameters by name, the same arithmetic written out."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


def plain_gpt_logits(params: dict[str, Any], tokens: Any, *, heads: int) -> Any:
    """Logits [batch, time, vocab] of integer tokens [batch, time]; `params` holds
    the `gpt` parameters by their dotted names."""
    p = params
    batch, time = tokens.shape
    dim = p["model.embed.token"].shape[1]
    layers = len({n.split(".")[2] for n in p if n.startswith("model.blocks.")})

    def norm(x: Any, name: str) -> Any:
        scale = p[name][None, None, :]
        return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * scale

    def linear(x: Any, name: str) -> Any:
        return x @ p[f"{name}.weight"] + p[f"{name}.bias"][None, None, :]

    x = p["model.embed.token"][tokens] + p["model.embed.position"][None, :time]
    head_dim = dim // heads
    mask = jnp.tril(jnp.ones((time, time), bool))[None, None]
    for i in range(layers):
        b = f"model.blocks.{i}"
        h = norm(x, f"{b}.attn-norm.scale")
        q, k, v = (
            linear(h, f"{b}.attn.{n}").reshape(batch, time, heads, head_dim)
            for n in ("query", "key", "value")
        )
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / head_dim**0.5
        weights = jax.nn.softmax(jnp.where(mask, scores, -jnp.inf), axis=-1)
        mixed = jnp.einsum("bhqk,bkhd->bqhd", weights, v)
        x = x + linear(mixed.reshape(batch, time, dim), f"{b}.attn.out")
        h = jax.nn.gelu(linear(norm(x, f"{b}.mlp-norm.scale"), f"{b}.mlp.up"))
        x = x + linear(h, f"{b}.mlp.down")
    return norm(x, "model.norm.scale") @ p["model.head.weight"]
