"""`gpt`'s chunked cross-entropy (`nn_xent`, `GPT(loss_chunks=...)`,
`:loss-chunks`): off, the training program is the whole-logits one; on, the loss
and the gradient are the whole logits' up to rounding, a training prediction is
`ChunkedLogits` that only `cross-entropy` reads while evaluation sees the logits,
the compiled step holds fewer temporaries, a run file trains the same losses, and
bad values are refused."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from gpt_params import TINY, assert_gradients_close, random_params, tokens

from jaxnitro.compile.precision import cast_floating, compute_dtype
from jaxnitro.experiment.modes import training_mode
from jaxnitro.runfile.check import check_file
from jaxnitro.runfile.engine import compile_run, graph_key
from jaxnitro.runfile.evaluator import evaluate_file
from jaxnitro.runfile.knobs import Selection
from jaxnitro.runfile.nn_modules import GPT
from jaxnitro.runfile.nn_xent import (
    ChunkedLogits,
    check_loss_chunks,
    divisor_near,
    token_cross_entropy,
)
from jaxnitro.runfile.running import run_file
from jaxnitro.runfile.source import RunfileError
from jaxnitro.runfile.stdlib_nn import GPTSpec, flatten

from .conftest import MINIMAL

EXAMPLES = Path(__file__).parents[2] / "examples" / "runfiles"
CHECKPOINT = jax.make_jaxpr(jax.checkpoint(lambda x: x))(1.0).eqns[0].primitive
"""JAX's rematerialisation primitive, whatever this version names it."""


def train_loss(spec: GPTSpec, precision: str = "f32"):
    """The mean next-token loss of `spec` as the engine's train program computes
    it (`compile.programs.call_forward`): the parameters cast to the compute dtype,
    the forward pass in train mode, its outputs cast to float32, then the run
    file's `cross-entropy` (`token_cross_entropy`)."""
    compute = compute_dtype(precision)

    def loss(params, batch):
        if compute is not None:
            params = cast_floating(params, compute)
        with training_mode(True):
            prediction = spec.apply(params, batch[:, :-1], None)
        if compute is not None:
            prediction = cast_floating(prediction, jnp.float32)
        return token_cross_entropy(prediction, batch[:, 1:]).mean()

    return loss


def chunked(chunks: int, spec: GPTSpec = TINY) -> GPTSpec:
    return dataclasses.replace(spec, loss_chunks=chunks)


def test_off_the_training_program_is_the_whole_logits_one():
    # Train mode changes nothing while the option is off: the same program as the
    # plain forward pass and Optax's cross-entropy (the engine's before it).
    import optax

    def plain(params, batch):
        logits = TINY.apply(params, batch[:, :-1], None)
        return optax.softmax_cross_entropy_with_integer_labels(
            logits, batch[:, 1:]
        ).mean()

    params, batch = random_params(TINY, 0), tokens(2)
    grad = jax.make_jaxpr(jax.grad(train_loss(chunked(0))))(params, batch)
    assert str(grad) == str(jax.make_jaxpr(jax.grad(plain))(params, batch))
    assert TINY.loss_chunks == 0


def loop_bodies(jaxpr) -> list:
    """The bodies of the loops (`scan`) a jaxpr runs, at its top level."""
    return [
        eqn.params["jaxpr"].jaxpr for eqn in jaxpr.eqns if eqn.primitive.name == "scan"
    ]


def test_on_the_loss_is_one_loop_over_the_chunks_each_rematerialised():
    params, batch = random_params(TINY, 0), tokens(2)
    forward = jax.make_jaxpr(train_loss(chunked(4)))(params, batch).jaxpr
    assert loop_bodies(jax.make_jaxpr(train_loss(TINY))(params, batch).jaxpr) == []
    [body] = loop_bodies(forward)
    assert [eqn.primitive for eqn in body.eqns] == [CHECKPOINT]
    [scan] = [eqn for eqn in forward.eqns if eqn.primitive.name == "scan"]
    assert scan.params["length"] == 4
    # Its own product: [batch, time / 4, dim] x [dim, vocab], a quarter of the
    # logits a chunk.
    inner = body.eqns[0].params["jaxpr"]
    [dot] = [e for e in inner.eqns if e.primitive.name == "dot_general"]
    assert dot.outvars[0].aval.shape == (2, 16, TINY.vocab)


@pytest.mark.parametrize("chunks", [1, 2, 4, 64])
def test_the_chunks_give_the_whole_logits_loss_and_gradient(chunks):
    params, batch = random_params(TINY, 3), tokens()
    whole = jax.jit(jax.value_and_grad(train_loss(TINY)))
    split = jax.jit(jax.value_and_grad(train_loss(chunked(chunks))))
    (loss, grads), (expected, expected_grads) = (
        split(params, batch),
        whole(params, batch),
    )
    # Measured (f32, 2 CPU cores): the loss within 4.1e-7 (relative), every
    # gradient within 5.4e-7 of its largest entry; the key biases, whose gradient
    # is zero in exact arithmetic, differ by rounding alone (6.5e-10 at 64 chunks).
    # One chunk is the whole-logits program to the bit (XLA unrolls the loop).
    np.testing.assert_allclose(loss, expected, rtol=1e-6)
    assert_gradients_close(grads, expected_grads)


@pytest.mark.parametrize("chunks", [4, 64])
def test_in_bf16_the_chunks_are_as_close_to_float32_as_the_whole_logits(chunks):
    params, batch = random_params(TINY, 3), tokens()
    exact = jax.jit(jax.grad(train_loss(TINY)))(params, batch)
    whole = jax.jit(jax.value_and_grad(train_loss(TINY, "bf16")))
    split = jax.jit(jax.value_and_grad(train_loss(chunked(chunks), "bf16")))
    (loss, grads), (expected, whole_grads) = split(params, batch), whole(params, batch)
    # Both bf16 programs are judged against the float32 gradient, each leaf's error
    # relative to its largest entry, since how far bf16 falls from float32 is up
    # to XLA: on 2 CPU cores with JAX 0.10.2 the whole-logits head's gradient was
    # 5.9e-3 off, with JAX 0.11.2 1.7e-1 (the chunked one 5.9e-3 and 5.1e-2). The
    # chunks' worst leaf against the whole logits' same leaf: 1.05x (0.10.2),
    # 1.24x (0.11.2). The head's gradient sums its chunks in float32: summed in
    # bfloat16 it was 4.9e-2 off at 64 chunks (JAX 0.10.2), 8x the whole
    # logits'. The key biases hold rounding noise alone. The loss: within 4.9e-7
    # (relative; the same bfloat16 products, the float32 cross-entropy summed in
    # another order).
    np.testing.assert_allclose(loss, expected, rtol=1e-4)

    def error(approx, name):
        scale = jnp.abs(exact[name]).max()
        return float(jnp.abs(approx[name] - exact[name]).max() / scale)

    for name in grads:
        if name.endswith(".attn.key.bias"):
            continue
        ours, theirs = error(grads, name), error(whole_grads, name)
        assert ours <= 1.5 * theirs + 5e-3, (name, ours, theirs)
    head = "model.head.weight"
    assert error(grads, head) <= 1.05 * error(whole_grads, head) + 1e-4


def test_a_training_prediction_is_chunked_and_an_evaluation_one_the_logits():
    params, inputs = random_params(TINY, 1), tokens(2)[:, :-1]
    spec = chunked(4)
    logits = spec.apply(params, inputs, None)  # eval mode: jaxnitro.training() False
    assert isinstance(logits, jax.Array) and logits.shape == (2, 64, 256)
    np.testing.assert_array_equal(logits, TINY.apply(params, inputs, None))
    with training_mode(True):
        prediction = spec.apply(params, inputs, None)
    assert isinstance(prediction, ChunkedLogits)
    assert (prediction.chunks, prediction.compute) == (4, "float32")
    assert prediction.logits_shape == (2, 64, 256)
    assert prediction.hidden.shape == (2, 64, 64)
    assert prediction.kernel is params["model.head.weight"]
    np.testing.assert_allclose(prediction.logits(), logits, rtol=1e-6, atol=1e-6)
    # A pytree whose arrays are its leaves: the engine casts a bf16 run's outputs.
    leaves, tree = jax.tree.flatten(prediction)
    assert len(leaves) == 2
    cast = jax.tree.unflatten(tree, [leaf.astype(jnp.bfloat16) for leaf in leaves])
    assert (cast.chunks, cast.compute, cast.hidden.dtype) == (4, "float32", "bfloat16")
    with training_mode(True):
        bf16 = spec.apply(cast_floating(params, jnp.bfloat16), inputs, None)
    assert bf16.compute == "bfloat16"


def temp_bytes(spec: GPTSpec, batch: jax.Array) -> int:
    """The temporaries XLA plans for the compiled gradient of the train loss."""
    params = random_params(spec, 0)
    step = jax.jit(jax.grad(train_loss(spec)))
    analysis = step.lower(params, batch).compile().memory_analysis()
    if analysis is None:
        pytest.skip(f"no memory analysis on {jax.default_backend()}")
    return int(analysis.temp_size_in_bytes)


def test_the_compiled_step_holds_a_chunk_of_the_logits_at_a_time():
    # A vocabulary large enough for the logits (float32[4, 128, 8192], 16 MiB) and
    # their gradient to dominate the step's temporaries. Measured on XLA:CPU:
    # whole 34.8 MiB, 2 chunks 19.9, 4 chunks 11.8, 8 chunks 7.8, 16 chunks 5.8
    # (the loop's body holds one chunk's logits; the whole never exist).
    spec = GPTSpec(vocab=8192, layers=1, dim=32, heads=2, context=128)
    batch = jax.random.randint(jax.random.key(0), (4, 129), 0, spec.vocab)
    logits = 4 * 128 * spec.vocab * 4
    whole, four, sixteen = (temp_bytes(chunked(n, spec), batch) for n in (0, 4, 16))
    if whole == 0:
        pytest.skip(f"{jax.default_backend()} reports no temporaries")
    assert whole > 2 * logits
    assert four < whole - logits  # at least the logits' size saved
    assert sixteen < four


def test_the_module_refuses_chunks_that_do_not_divide_the_context():
    with pytest.raises(ValueError) as caught:
        GPT(32, 1, 8, 2, 64, loss_chunks=5, rngs=nnx.Rngs(0))
    assert str(caught.value) == (
        "GPT(loss_chunks=...) must be 0 (off) or a positive integer dividing the "
        "context 64, got 5: it is the number of chunks the training loss cuts the "
        "positions into, computing the head's logits one chunk at a time. Pass a "
        "divisor of 64, e.g. loss_chunks=4, or 0 for the whole logits at once."
    )
    assert GPT(32, 1, 8, 2, 64, rngs=nnx.Rngs(0)).loss_chunks == 0
    assert GPT(32, 1, 8, 2, 64, loss_chunks=64, rngs=nnx.Rngs(0)).loss_chunks == 64


@pytest.mark.parametrize(
    ("value", "shown", "near"),
    [
        (-1, "-1", 4),
        (True, "True", 4),
        (2.0, "2.0", 4),
        ("4", "'4'", 4),
        (96, "96", 64),
    ],
)
def test_chunks_that_are_no_whole_positive_number_are_refused(value, shown, near):
    with pytest.raises(ValueError, match=f"got {shown}: .* e.g. chunks={near}, or 0"):
        check_loss_chunks(value, 64, "E.chunks", "chunks={}")
    assert check_loss_chunks(0, 64, "E.chunks", "chunks={}") == 0
    assert check_loss_chunks(16, 64, "E.chunks", "chunks={}") == 16
    assert [divisor_near(n, 12) for n in (1, 5, 8, 9, 100)] == [1, 4, 6, 6, 12]


def test_a_training_batch_the_chunks_do_not_divide_is_refused():
    module = GPT(32, 1, 8, 2, 64, loss_chunks=4, rngs=nnx.Rngs(0))
    batch = jnp.zeros((2, 10), jnp.int32)
    assert module(batch).shape == (2, 10, 32)  # evaluation reads the logits
    with pytest.raises(ValueError) as caught:
        module.loss_logits(batch)
    assert str(caught.value) == (
        "GPT.loss_chunks is 4: it cuts the positions of a training batch into 4 "
        "chunks, but this batch has 10 positions, which 4 does not divide. Train on "
        "windows of a length 4 divides (the model's whole context is one), or pass "
        "a loss_chunks dividing 10, e.g. loss_chunks=5."
    )
    uneven = ChunkedLogits(jnp.zeros((2, 10, 8)), jnp.zeros((8, 32)), 4, "float32")
    with pytest.raises(
        ValueError, match="^ChunkedLogits.chunks is 4: .* e.g. chunks=5"
    ):
        token_cross_entropy(uneven, jnp.zeros((2, 10), jnp.int32))


def with_model(text: str) -> str:
    return MINIMAL.replace("(gpt :vocab 32 :layers 2 :dim 32 :heads 2)", text)


def test_the_run_file_passes_loss_chunks_to_the_module(write):
    model = evaluate_file(
        write(with_model("(gpt :vocab 32 :layers 2 :dim 32 :heads 2 :loss-chunks 4)"))
    ).value("model")
    assert model.loss_chunks == 4
    assert model.build(nnx.Rngs(0)).loss_chunks == 4
    assert (
        model.parameter_shapes()
        == dataclasses.replace(model, loss_chunks=0).parameter_shapes()
    )
    assert evaluate_file(write(MINIMAL, "plain.sx")).value("model").loss_chunks == 0
    # gpt2.sx's knob, off unless set.
    gpt2 = str(EXAMPLES / "gpt2.sx")
    assert evaluate_file(gpt2).value("model").loss_chunks == 0
    selection = Selection(variant="tiny", sets=(("loss-chunks", "4"),))
    assert evaluate_file(gpt2, selection).value("model").loss_chunks == 4


@pytest.mark.parametrize(
    ("value", "code", "message", "fix"),
    [
        (
            ":four",
            "E-EVAL-007",
            "`:loss-chunks` of `gpt` must be 0 (the whole logits at once) or a "
            "positive integer, got the keyword :four :four",
            None,
        ),
        (
            "1.5",
            "E-EVAL-007",
            "`:loss-chunks` of `gpt` must be 0 (the whole logits at once) or a "
            "positive integer, got a float 1.5",
            None,
        ),
        (
            "-1",
            "E-EVAL-007",
            "`:loss-chunks` of `gpt` must be 0 or positive, got -1",
            "fix: write :loss-chunks 4 to compute the training loss in 4 chunks",
        ),
        (
            "5",
            "E-SHAPE-013",
            "`:loss-chunks 5` of `gpt` does not divide its :context 1024",
            "fix: write :loss-chunks 4 (a divisor of 1024), or leave it out (0: the "
            "whole logits at once)",
        ),
    ],
)
def test_the_run_file_refuses_bad_loss_chunks(write, value, code, message, fix):
    path = write(
        with_model(f"(gpt :vocab 32 :layers 2 :dim 32 :heads 2 :loss-chunks {value})")
    )
    with pytest.raises(RunfileError) as caught:
        evaluate_file(path)
    assert caught.value.codes == [code]
    assert message in str(caught.value)
    assert fix is None or fix in str(caught.value)


def test_check_refuses_chunks_a_training_batch_does_not_divide(write):
    # 32 divides the default :context (1024), not the 16 positions prepare gives.
    path = write(
        with_model("(gpt :vocab 32 :layers 2 :dim 32 :heads 2 :loss-chunks 32)")
    )
    with pytest.raises(RunfileError) as caught:
        check_file(path)
    assert caught.value.codes == ["E-SHAPE-013"]
    message = str(caught.value)
    assert (
        "`gpt` with :loss-chunks 32 cuts the 16 positions of a training batch into "
        "32 chunks, which 32 does not divide"
    ) in message
    assert "or write :loss-chunks 16" in message


EVALUATED = """
(defeval valid
  :loader (loader :sources [(files ["data/tiny-train.jsonl.gz"] :encoding "jsonl.gz")]
                  :fields [(field :tokens :from "input_ids" :dtype :i32 :shape [17])]
                  :batch-size 4)
  :batches 2)
"""


KIND = (
    "the logits [4, 16, 32] of `gpt :loss-chunks 4` in training, which only "
    "`cross-entropy` reads"
)
"""How the run file's messages name the training prediction of `MODEL`."""

MODEL = "(gpt :vocab 32 :layers 2 :dim 32 :heads 2 :loss-chunks 4)"


@pytest.mark.parametrize(
    ("use", "message"),
    [
        ("(cast prediction :f32)", f"`cast` takes an array, got {KIND}"),
        ("(slice prediction 1 0 8)", f"`slice` takes an array, got {KIND}"),
        ("(* prediction 2.0)", f"`*` cannot take these values: <{KIND}>, 2.0"),
    ],
)
def test_only_cross_entropy_reads_the_training_prediction(write, use, message):
    text = with_model(MODEL).replace(
        "(defun objective (prediction targets) (cross-entropy prediction targets))",
        f"(defun objective (prediction targets)\n  (cross-entropy {use} targets))",
    )
    with pytest.raises(RunfileError) as caught:
        check_file(write(text))
    assert caught.value.codes == ["E-EVAL-007"]
    assert message in str(caught.value)


def test_an_evaluation_pass_reads_the_logits(write):
    # The use the objective may not make is an array's in `evaluate`.
    text = with_model(MODEL).replace(
        "(defvar optimizer",
        "(defun evaluate (prediction targets)\n"
        "  (list :loss (cross-entropy (cast prediction :f32) targets)))\n\n"
        "(defvar optimizer",
    )
    text = text.replace("(defun prepare", EVALUATED.strip() + "\n\n(defun prepare")
    assert check_file(write(text)).parameters == 32


def test_a_sequential_refuses_a_chunked_gpt_another_layer_follows(write):
    text = with_model(f"(sequential {MODEL} (linear :in 32 :out 32))").replace(
        "cross-entropy gpt)", "cross-entropy gpt linear sequential)"
    )
    with pytest.raises(RunfileError) as caught:
        evaluate_file(write(text))
    assert caught.value.codes == ["E-SHAPE-013"]
    message = str(caught.value)
    assert (
        "layer 0 of `sequential` is a `gpt` with :loss-chunks 4, whose training "
        "prediction only `cross-entropy` reads, and another layer follows it"
    ) in message
    assert "fix: leave :loss-chunks out of a `gpt` that other layers follow" in message
    # Alone in a sequential, it is the last layer: its prediction reaches the loss.
    alone = with_model(f"(sequential {MODEL})").replace(
        "cross-entropy gpt)", "cross-entropy gpt sequential)"
    )
    assert check_file(write(alone, "alone.sx")).parameters == 32


def test_loss_chunks_move_the_graph_key(write):
    keys = {}
    for chunks in (0, 4):
        model = f"(gpt :vocab 32 :layers 2 :dim 32 :heads 2 :loss-chunks {chunks})"
        keys[chunks] = compile_run(write(with_model(model), f"{chunks}.sx")).graph
    assert keys[0] != keys[4]
    # Leaving it out is 0 exactly: the same programs, served from the cache.
    assert graph_key(evaluate_file(write(MINIMAL, "plain.sx"))) == keys[0]


def test_a_run_file_with_loss_chunks_trains_the_whole_logits_losses(tmp_path):
    # minimal.sx (f32, two microbatches a step) four steps, with and without.
    (tmp_path / "data").mkdir()
    shutil.copy(EXAMPLES / "data" / "tiny-train.jsonl.gz", tmp_path / "data")
    found = {}
    for chunks in (0, 4):
        model = f"(gpt :vocab 32 :layers 2 :dim 32 :heads 2 :loss-chunks {chunks})"
        path = tmp_path / f"chunks-{chunks}.sx"
        path.write_text(with_model(model))
        outcome = run_file(str(path), steps=4, run_dir=str(tmp_path / f"run-{chunks}"))
        handle = outcome.handle
        found[chunks] = (
            [row["train_loss"] for row in handle.history],
            {k: np.asarray(v) for k, v in flatten(handle.train_state.params).items()},
        )
        handle.release()
    (losses, params), (expected, expected_params) = found[4], found[0]
    # Measured (f32): the losses within 1.7e-8 (relative), the parameters within
    # 6.7e-8.
    assert len(losses) == len(expected) >= 1
    np.testing.assert_allclose(losses, expected, rtol=1e-6)
    assert params.keys() == expected_params.keys()
    for name, value in params.items():
        np.testing.assert_allclose(
            value, expected_params[name], atol=1e-6, err_msg=name
        )
