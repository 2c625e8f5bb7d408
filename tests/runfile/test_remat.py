"""`gpt`'s rematerialisation policies (`nn_modules.REMAT_POLICIES`, `:remat`): the
same loss and gradient as the plain program, less kept for the backward pass, a
different program (and so a different graph key), and unknown names refused."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx
from gpt_params import TINY, loss_fn, random_params, tokens

from jaxnitro.runfile.engine import compile_run, graph_key
from jaxnitro.runfile.evaluator import evaluate_file
from jaxnitro.runfile.nn_modules import GPT, REMAT_POLICIES, check_remat
from jaxnitro.runfile.source import RunfileError
from jaxnitro.runfile.stdlib_nn import REMAT, GPTSpec

from .conftest import MINIMAL

CHECKPOINT = jax.make_jaxpr(jax.checkpoint(lambda x: x))(1.0).eqns[0].primitive
"""JAX's rematerialisation primitive, whatever this version names it."""


def test_the_policies_are_the_run_files():
    assert tuple(REMAT_POLICIES) == REMAT
    assert REMAT_POLICIES["none"] is None
    assert REMAT_POLICIES["blocks"] is jax.checkpoint_policies.nothing_saveable
    assert (
        REMAT_POLICIES["dots"]
        is jax.checkpoint_policies.dots_with_no_batch_dims_saveable
    )


@pytest.mark.parametrize("remat", ["blocks", "dots"])
def test_each_policy_gives_the_plain_loss_and_gradient(remat):
    params, batch = random_params(TINY, 3), tokens()
    plain = jax.jit(jax.value_and_grad(loss_fn(TINY)))
    policy = jax.jit(
        jax.value_and_grad(loss_fn(dataclasses.replace(TINY, remat=remat)))
    )
    (loss, grads), (expected, expected_grads) = (
        policy(params, batch),
        plain(params, batch),
    )
    np.testing.assert_allclose(loss, expected, rtol=1e-6)
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        np.testing.assert_allclose(
            grad, expected_grads[name], rtol=1e-5, atol=1e-7, err_msg=name
        )


def checkpoints(remat: str) -> int:
    """How many rematerialised calls the tiny forward pass traces."""
    spec = dataclasses.replace(TINY, remat=remat)
    jaxpr = jax.make_jaxpr(loss_fn(spec))(random_params(TINY, 0), tokens())
    return sum(eqn.primitive is CHECKPOINT for eqn in jaxpr.eqns)


def test_none_traces_the_plain_program_and_the_others_one_checkpoint_a_block():
    assert checkpoints("none") == 0
    assert checkpoints("blocks") == checkpoints("dots") == TINY.layers


def saved_bytes(remat: str, batch: int = 8) -> int:
    """The bytes the forward pass keeps for the backward one: the residuals `jax.vjp`
    holds (the parameters and tokens among them)."""
    spec = dataclasses.replace(TINY, remat=remat)
    loss = loss_fn(spec)
    _, backward = jax.vjp(lambda p: loss(p, tokens(batch)), random_params(TINY, 0))
    return sum(leaf.nbytes for leaf in jax.tree.leaves(backward))


def test_the_backward_pass_keeps_less_under_each_policy():
    # Measured on the tiny model at batch 8: none 13.2 MB, dots 3.9 MB, blocks
    # 1.8 MB (the parameters, 0.55 MB, are among them under every policy).
    kept = {remat: saved_bytes(remat) for remat in REMAT}
    assert kept["blocks"] < kept["dots"] < kept["none"]
    assert kept["blocks"] < kept["none"] / 4


@pytest.mark.skipif(
    jax.default_backend() == "cpu",
    reason="XLA:CPU drops the optimization barriers and schedules the recomputed "
    "forward pass early, so its temporaries are the same under every policy "
    "(measured); scripts/device/tests.sh runs this on a TPU",
)
def test_blocks_need_fewer_temporaries_in_the_compiled_step():
    # A context long enough for the attention weights [batch, heads, time, time]
    # to dominate what a block keeps.
    spec = GPTSpec(vocab=256, layers=4, dim=64, heads=4, context=512)
    params, batch = random_params(spec, 0), tokens(4, 513)

    def temp_bytes(remat: str) -> int:
        step = jax.jit(jax.grad(loss_fn(dataclasses.replace(spec, remat=remat))))
        analysis = step.lower(params, batch).compile().memory_analysis()
        if analysis is None:
            pytest.skip(f"no memory analysis on {jax.default_backend()}")
        # The peak where the backend reports one, else the temporaries (the TPU
        # v5e machine reported 0 temporaries for both programs on 2026-12-06).
        peak = int(getattr(analysis, "peak_memory_in_bytes", 0) or 0)
        return peak or int(analysis.temp_size_in_bytes)

    blocks, none = temp_bytes("blocks"), temp_bytes("none")
    if blocks == none == 0:
        pytest.skip(f"{jax.default_backend()} reports no peak and no temporaries")
    assert blocks < none


def test_the_module_refuses_an_unknown_policy():
    with pytest.raises(ValueError) as caught:
        GPT(32, 1, 8, 2, 4, remat="all", rngs=nnx.Rngs(0))
    assert str(caught.value) == (
        "GPT(remat=...) must be one of 'none', 'blocks', 'dots', got 'all': it "
        'names what the backward pass keeps of each block ("none": everything, '
        '"blocks": only its input, "dots": the outputs of its linear layers). '
        'Pass one of them, e.g. remat="dots".'
    )
    assert check_remat("dots", "x", "y") == "dots"
    with pytest.raises(ValueError, match="E.remat must be one of .* got None"):
        check_remat(None, "E.remat", 'remat="dots"')


def with_model(text: str) -> str:
    return MINIMAL.replace("(gpt :vocab 32 :layers 2 :dim 32 :heads 2)", text)


def test_the_run_file_passes_remat_to_the_module(write):
    model = evaluate_file(
        write(with_model("(gpt :vocab 32 :layers 2 :dim 32 :heads 2 :remat :dots)"))
    ).value("model")
    assert model.remat == "dots"
    assert model.build(nnx.Rngs(0)).remat == "dots"
    assert (
        model.parameter_shapes()
        == dataclasses.replace(model, remat="none").parameter_shapes()
    )
    default = evaluate_file(write(MINIMAL, "plain.sx")).value("model")
    assert default.remat == "none"


@pytest.mark.parametrize(
    "value, shown", [(":all", ":all"), ('"dots"', '"dots"'), ("1", "1")]
)
def test_the_run_file_refuses_an_unknown_policy(write, value, shown):
    path = write(
        with_model(f"(gpt :vocab 32 :layers 2 :dim 32 :heads 2 :remat {value})")
    )
    with pytest.raises(RunfileError) as caught:
        evaluate_file(path)
    assert caught.value.codes == ["E-EVAL-007"]
    message = str(caught.value)
    assert (
        "`:remat` of `gpt` is :none, :blocks, :dots (what the backward pass keeps "
        f"of each block), got {shown}"
    ) in message
    assert "write :remat :blocks" in message


def test_remat_moves_the_graph_key(write):
    keys = {}
    for remat in REMAT:
        model = f"(gpt :vocab 32 :layers 2 :dim 32 :heads 2 :remat :{remat})"
        keys[remat] = compile_run(write(with_model(model), f"{remat}.sx")).graph
    assert len(set(keys.values())) == len(REMAT)
    # Leaving it out is :none exactly: the same programs, served from the cache.
    assert graph_key(evaluate_file(write(MINIMAL, "plain.sx"))) == keys["none"]
