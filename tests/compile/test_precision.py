"""precision="bf16": forward and backward in bfloat16, float32 everywhere else."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from compile_counts import kinds_compiled
from experiments import Tiny, make_batches

import jaxnitro as nx
from jaxnitro.compile.precision import cast_floating, like_dtypes


def quiet(**kw):
    return {"logger": None, "checkpointer": None, **kw}


SEEN: list = []


class Watched(Tiny):
    """Tiny recording the dtypes forward is traced with."""

    def forward(self, model, params, state, *, x):
        SEEN.append((params["w1"].dtype, x.dtype, self.temperature.dtype))
        return super().forward(model, params, state, x=x)

    def loss(self, logits, *, y):
        SEEN.append(("loss", logits.dtype))
        return super().loss(logits, y=y)


def test_bf16_runs_forward_in_bfloat16_and_keeps_float32_weights_and_loss():
    SEEN.clear()
    nitro = nx.Nitro(Watched(), precision="bf16", **quiet())
    nitro.train()
    assert (jnp.bfloat16, jnp.bfloat16, jnp.bfloat16) in SEEN
    assert ("loss", jnp.float32) in SEEN  # outputs back in float32 for the loss
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(nitro.parameters))
    opt_floats = [
        leaf
        for leaf in jax.tree.leaves(nitro.train_state.opt_state)
        if jnp.issubdtype(leaf.dtype, jnp.floating)
    ]
    assert opt_floats and all(leaf.dtype == jnp.float32 for leaf in opt_floats)
    losses = [row["train_loss"] for row in nitro.history]
    assert np.isfinite(losses).all() and losses[-1] < losses[0]
    outputs = nitro.predict(make_batches(4, 4)[0])
    assert outputs.dtype == np.float32


def test_bf16_trains_close_to_f32_and_compiles_its_own_programs():
    f32 = nx.Nitro(Tiny(max_epochs=3), **quiet())
    f32.train()
    bf16 = nx.Nitro(Tiny(max_epochs=3), precision="bf16", **quiet())
    kinds = kinds_compiled(bf16.train)
    assert "train_step" in kinds  # a program of its own, not f32's from the cache
    pairs = zip(
        jax.tree.leaves(f32.parameters), jax.tree.leaves(bf16.parameters), strict=True
    )
    for a, b in pairs:
        np.testing.assert_allclose(a, b, atol=0.05)
    assert bf16.config.precision == "bf16" and bf16.config.sources["precision"] == (
        "keyword"
    )


def test_a_bad_precision_is_refused_with_the_choices():
    with pytest.raises(nx.ConfigError, match="precision must be one of 'f32', 'bf16'"):
        nx.Nitro(Tiny(), precision="fp16", **quiet())


def test_the_casts_leave_integers_and_match_the_state_dtypes_back():
    tree = {"w": jnp.ones(2), "n": jnp.arange(2), "flag": jnp.array(True)}
    cast = cast_floating(tree, jnp.bfloat16)
    assert cast["w"].dtype == jnp.bfloat16
    assert cast["n"].dtype == tree["n"].dtype and cast["flag"].dtype == jnp.bool_
    back = like_dtypes(cast, tree)
    assert back["w"].dtype == jnp.float32
    other = {"w": jnp.ones(2, jnp.bfloat16)}
    assert like_dtypes(other, tree) is other  # another structure: left as it is
