"""Model values: `gpt` as a Flax NNX module, its parameter names and order, its
init from the key, and its forward pass against a direct computation."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gpt_params import random_params
from plain_gpt import plain_gpt_logits

from jaxnitro.runfile.nn_models import parameter_name, structure
from jaxnitro.runfile.stdlib_nn import GPTSpec

SPEC = GPTSpec(vocab=11, layers=2, dim=8, heads=2, context=6)


def test_gpt_declares_the_documented_names_in_forward_order():
    names = list(SPEC.parameter_shapes())
    block = [
        "attn-norm.scale",
        *(
            f"attn.{p}.{w}"
            for p in ("query", "key", "value", "out")
            for w in ("weight", "bias")
        ),
        "mlp-norm.scale",
        "mlp.up.weight",
        "mlp.up.bias",
        "mlp.down.weight",
        "mlp.down.bias",
    ]
    assert names == [
        "model.embed.token",
        "model.embed.position",
        *(f"model.blocks.{i}.{n}" for i in range(2) for n in block),
        "model.norm.scale",
        "model.head.weight",
    ]
    assert len(names) == 4 + 14 * SPEC.layers
    shapes = SPEC.parameter_shapes()
    assert shapes["model.embed.position"] == (6, 8)
    assert shapes["model.blocks.1.mlp.up.weight"] == (8, 32)
    assert shapes["model.head.weight"] == (8, 11)


def test_blocks_past_nine_sort_by_number():
    names = list(
        GPTSpec(vocab=4, layers=11, dim=4, heads=1, context=2).parameter_shapes()
    )
    blocks = [n.split(".")[2] for n in names if n.endswith("attn-norm.scale")]
    assert blocks == [str(i) for i in range(11)]


@pytest.mark.parametrize(
    "path, name",
    [
        (("embed", "token", "embedding"), "model.embed.token"),
        (("blocks", 3, "attn_norm", "scale"), "model.blocks.3.attn-norm.scale"),
        (("head", "kernel"), "model.head.weight"),
        (("layers", 1, "layers", 0, "bias"), "model.1.0.bias"),
        (("weight", "embedding"), "model.weight"),
    ],
)
def test_a_parameter_name_follows_from_its_nnx_path(path, name):
    assert parameter_name(path) == name


def test_the_structure_is_built_once_per_declaration():
    again = GPTSpec(vocab=11, layers=2, dim=8, heads=2, context=6)
    assert structure(again) is structure(SPEC)


def test_gpt_starts_from_the_key_as_documented():
    spec = GPTSpec(vocab=64, layers=2, dim=64, heads=2, context=64)
    big = spec.init(jax.random.key(0))
    assert {n: p.shape for n, p in big.items()} == spec.parameter_shapes()
    assert all(p.dtype == jnp.float32 for p in big.values())
    assert float(big["model.embed.token"].std()) == pytest.approx(0.02, rel=0.1)
    assert float(big["model.blocks.0.attn.query.weight"].std()) == pytest.approx(
        0.02, rel=0.1
    )
    assert float(big["model.blocks.1.mlp.down.weight"].std()) == pytest.approx(
        0.01, rel=0.1
    )
    assert float(big["model.blocks.0.attn.out.weight"].std()) == pytest.approx(
        0.01, rel=0.1
    )
    assert not np.any(big["model.blocks.0.attn.key.bias"])
    assert np.all(big["model.norm.scale"] == 1.0)
    again = spec.init(jax.random.key(0))
    other = spec.init(jax.random.key(1))
    assert all(np.array_equal(big[n], again[n]) for n in big)
    assert not np.array_equal(big["model.head.weight"], other["model.head.weight"])


def test_the_nnx_forward_equals_the_plain_jax_computation():
    params = random_params(SPEC, 3)
    tokens = jnp.array([[1, 2, 3, 4, 5], [5, 4, 3, 2, 10]], jnp.int32)
    got = jax.jit(lambda p, t: SPEC.apply(p, t, None))(params, tokens)
    expected = plain_gpt_logits(params, tokens, heads=SPEC.heads)
    assert got.shape == (2, 5, 11) and got.dtype == jnp.float32
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    grads = jax.jit(jax.grad(lambda p: SPEC.apply(p, tokens, None).sum()))(params)
    plain = jax.jit(
        jax.grad(lambda p: plain_gpt_logits(p, tokens, heads=SPEC.heads).sum())
    )(params)
    for name in params:
        np.testing.assert_allclose(grads[name], plain[name], rtol=1e-4, atol=1e-5)


def test_a_position_never_sees_the_tokens_after_it():
    params = SPEC.init(jax.random.key(0))
    tokens = jnp.array([[1, 2, 3, 4, 5], [5, 4, 3, 2, 1]], jnp.int32)
    apply = jax.jit(lambda p, t: SPEC.apply(p, t, None))
    logits = apply(params, tokens)
    changed = apply(params, tokens.at[:, 4].set(9))
    np.testing.assert_allclose(changed[:, :4], logits[:, :4], rtol=1e-5)
    assert not np.allclose(changed[:, 4], logits[:, 4])


def test_bf16_parameters_compute_in_bf16():
    params = jax.tree.map(
        lambda p: p.astype(jnp.bfloat16), SPEC.init(jax.random.key(0))
    )
    tokens = jnp.array([[1, 2, 3]], jnp.int32)
    logits = SPEC.apply(params, tokens, None)
    assert logits.dtype == jnp.bfloat16 and logits.shape == (1, 3, 11)
