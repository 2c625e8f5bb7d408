"""`gpt`'s `attention="cudnn"` (`nn_cudnn`): the call it makes to JAX's fused
attention, checked through a stand-in that computes JAX's written-out form (JAX
traces cuDNN's kernel only where cuDNN is found, never on a CPU); its float32
refusal; the shapes-only trace a run file's check makes anywhere; on a GPU, the
compiled kernel. Its refusal off a GPU is tested with the flash kernel's, in
test_attention.py."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gpt_params import TINY, loss_fn, random_params, tokens

from jaxnitro.runfile.nn_cudnn import cudnn_causal_attention, shapes_only

from .test_attention import written_out

not_on_a_gpu = pytest.mark.skipif(
    jax.default_backend() == "gpu", reason="a GPU runs cuDNN's kernel itself"
)


@pytest.fixture
def asked(monkeypatch):
    """The calls made to `jax.nn.dot_product_attention`, each answered by JAX's
    written-out implementation (the function cuDNN's kernel computes)."""
    calls = []
    real = jax.nn.dot_product_attention

    def stand_in(q, k, v, **kwargs):
        calls.append(kwargs)
        return real(q, k, v, **{**kwargs, "implementation": "xla"})

    monkeypatch.setattr(jax.nn, "dot_product_attention", stand_in)
    return calls


def heads(seed: int, dtype=jnp.bfloat16) -> jax.Array:
    return jax.random.normal(jax.random.key(seed), (2, 16, 2, 8)).astype(dtype)


def test_cudnn_asks_jax_for_its_fused_causal_attention(asked):
    q, k, v = heads(0), heads(1), heads(2)
    out = jax.jit(cudnn_causal_attention)(q, k, v)
    # Causal, cuDNN's implementation, JAX's default scale 1 / sqrt(head_dim).
    assert asked == [{"is_causal": True, "implementation": "cudnn"}]
    assert out.shape == q.shape and out.dtype == jnp.bfloat16
    np.testing.assert_allclose(
        np.asarray(out, np.float32), written_out(q, k, v), atol=3e-2, rtol=3e-2
    )


def test_a_gpt_with_cudnn_gives_the_written_out_logits(asked):
    params = jax.tree.map(
        lambda p: p.astype(jnp.bfloat16), random_params(TINY, 0)
    )  # a bf16 run's compute copy
    batch = tokens(2)[:, :-1]
    cudnn = dataclasses.replace(TINY, attention="cudnn")
    got = jax.jit(lambda p, t: cudnn.apply(p, t, None))(params, batch)
    assert len(asked) == TINY.layers  # one fused call a block
    want = jax.jit(lambda p, t: TINY.apply(p, t, None))(params, batch)
    np.testing.assert_allclose(
        np.asarray(got, np.float32), np.asarray(want, np.float32), atol=0.1, rtol=0.05
    )


def test_cudnn_refuses_float32_when_traced(asked):
    q = heads(0, jnp.float32)
    with pytest.raises(ValueError) as caught:
        traced(q)
    assert str(caught.value) == (
        'attention "cudnn" is cuDNN\'s fused attention, which takes bfloat16 or '
        "float16 inputs, and this run computes its attention in float32. Train in "
        'bfloat16 (precision="bf16", or `:precision :bf16` in a run file), or use the '
        'attention written out in JAX ("xla"), which takes any dtype.'
    )
    assert asked == []


def traced(q: jax.Array) -> jax.ShapeDtypeStruct:
    """The attention's output shape, traced afresh (JAX reuses the trace of a
    function it saw with the same shapes)."""
    return jax.eval_shape(lambda a: cudnn_causal_attention(a, a, a), q)


@not_on_a_gpu
def test_only_a_shapes_trace_runs_without_cudnn():
    q = heads(0)
    with pytest.raises(RuntimeError, match="cuDNN"):
        traced(q)
    with shapes_only():  # float32 too: a check traces float32 parameters
        assert traced(q) == jax.ShapeDtypeStruct(q.shape, jnp.bfloat16)
        f32 = heads(0, jnp.float32)
        assert traced(f32) == jax.ShapeDtypeStruct(q.shape, jnp.float32)


@pytest.mark.skipif(
    jax.default_backend() != "gpu",
    reason="cuDNN's compiled kernel runs on an NVIDIA GPU only "
    "(scripts/device/tests.sh)",
)
def test_on_a_gpu_the_kernel_gives_the_written_out_loss_and_gradient():
    params = jax.tree.map(lambda p: p.astype(jnp.bfloat16), random_params(TINY, 3))
    batch = tokens(2)
    found = {}
    for attention in ("xla", "cudnn"):
        spec = dataclasses.replace(TINY, attention=attention)
        loss = loss_fn(spec)
        found[attention] = jax.jit(
            jax.value_and_grad(lambda p, t, loss=loss: loss(p, t).astype(jnp.float32))
        )(params, batch)
    (loss, grads), (expected, expected_grads) = found["cudnn"], found["xla"]
    # Loose on purpose: bf16 heads, and each attention rounds its own way; a wrong
    # layout, mask or scale is off by far more.
    np.testing.assert_allclose(float(loss), float(expected), rtol=2e-2)
    flat = jnp.concatenate(
        [grads[n].astype(jnp.float32).ravel() for n in sorted(grads)]
    )
    want = jnp.concatenate(
        [expected_grads[n].astype(jnp.float32).ravel() for n in sorted(grads)]
    )
    assert float(jnp.linalg.norm(flat - want) / jnp.linalg.norm(want)) < 5e-2
