"""The "sexpgpu/nn" builtins: the layers, `sequential`, `gpt`'s arguments and
`cross-entropy`, as a run file writes them."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxnitro.runfile.check import check_file
from jaxnitro.runfile.evaluator import evaluate_file
from jaxnitro.runfile.source import RunfileError
from jaxnitro.runfile.stdlib_nn import exports

from .conftest import MINIMAL

NN = '(require "sexpgpu/nn" gpt embedding linear mlp layer-norm sequential)\n'

LAYERED = """(sequential (embedding :vocab 32 :dim 16)
                           (mlp :dims [16 64 16])
                           (layer-norm :dim 16)
                           (linear :in 16 :out 32))"""


def model(write, text: str):
    return evaluate_file(write(NN + f"(defvar x {text})")).value("x")


def refused(write, text: str) -> tuple[list[str], str]:
    with pytest.raises(RunfileError) as caught:
        model(write, text)
    return caught.value.codes, str(caught.value)


def test_a_sequential_model_names_its_layers_by_position(write):
    shapes = model(write, LAYERED).parameter_shapes()
    assert shapes == {
        "model.0.weight": (32, 16),
        "model.1.0.weight": (16, 64),
        "model.1.0.bias": (64,),
        "model.1.1.weight": (64, 16),
        "model.1.1.bias": (16,),
        "model.2.scale": (16,),
        "model.2.bias": (16,),
        "model.3.weight": (16, 32),
        "model.3.bias": (32,),
    }


@pytest.mark.parametrize(
    "text, shapes",
    [
        ("(linear :in 3 :out 2)", {"model.weight": (3, 2), "model.bias": (2,)}),
        ("(linear :in 3 :out 2 :bias false)", {"model.weight": (3, 2)}),
        ("(embedding :vocab 7 :dim 4)", {"model.weight": (7, 4)}),
        ("(layer-norm :dim 5)", {"model.scale": (5,), "model.bias": (5,)}),
        (
            "(mlp :dims [3 8 8 2] :bias false)",
            {
                "model.0.weight": (3, 8),
                "model.1.weight": (8, 8),
                "model.2.weight": (8, 2),
            },
        ),
    ],
)
def test_each_layer_is_a_model_of_its_own(write, text, shapes):
    assert model(write, text).parameter_shapes() == shapes


def test_the_layers_compute_what_flax_documents(write):
    """linear, mlp (GELU between), layer-norm and embedding against NumPy-level
    arithmetic on the parameters by name."""
    seq = model(write, LAYERED)
    p = seq.init(jax.random.key(0))
    tokens = jnp.array([[0, 5, 31], [7, 7, 2]], jnp.int32)

    def row(name):  # a [features] parameter, broadcast explicitly (strict ranks)
        return p[name][None, None, :]

    x = p["model.0.weight"][tokens]
    h = jax.nn.gelu(x @ p["model.1.0.weight"] + row("model.1.0.bias"))
    x = h @ p["model.1.1.weight"] + row("model.1.1.bias")
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    x = (x - mean) / jnp.sqrt(var + 1e-5) * row("model.2.scale") + row("model.2.bias")
    expected = x @ p["model.3.weight"] + row("model.3.bias")
    got = jax.jit(lambda p, t: seq.apply(p, t, None))(p, tokens)
    assert got.shape == (2, 3, 32)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_layers_start_as_flax_nnx_does_from_the_key(write):
    p = model(write, LAYERED).init(jax.random.key(0))
    assert float(p["model.2.scale"].min()) == float(p["model.2.scale"].max()) == 1.0
    assert not np.any(p["model.1.0.bias"]) and not np.any(p["model.3.bias"])
    # LeCun normal: standard deviation 1/sqrt(fan in) = 0.125 for 64 inputs
    assert float(p["model.1.1.weight"].std()) == pytest.approx(0.125, rel=0.15)
    # the embedding: variance 1/dim, standard deviation 0.25 for 16 features
    assert float(p["model.0.weight"].std()) == pytest.approx(0.25, rel=0.15)
    again = model(write, LAYERED).init(jax.random.key(0))
    other = model(write, LAYERED).init(jax.random.key(1))
    assert all(np.array_equal(p[n], again[n]) for n in p)
    assert not np.array_equal(p["model.0.weight"], other["model.0.weight"])


@pytest.mark.parametrize(
    "text, code, needle",
    [
        (
            "(linear :in 0 :out 2)",
            "E-EVAL-007",
            "`:in` of `linear` must be positive, got 0",
        ),
        (
            '(linear :in "4" :out 2)',
            "E-EVAL-007",
            '`:in` of `linear` must be a positive integer, got a string "4"',
        ),
        (
            "(linear :in 4 :out 2 :bias 1)",
            "E-EVAL-007",
            "`:bias` of `linear` must be true or false, got an integer 1",
        ),
        ("(linear :in 4)", "E-EVAL-006", "`linear` needs :out"),
        (
            "(embedding :vocab 32 :dim 2.5)",
            "E-EVAL-007",
            "`:dim` of `embedding` must be a positive integer, got a float 2.5",
        ),
        (
            "(mlp :dims [16])",
            "E-EVAL-007",
            "`:dims` of `mlp` must be a vector of two or more positive integers "
            "(the input size, the hidden sizes, the output size), got [16]",
        ),
        ("(mlp :dims [16 0 4])", "E-EVAL-007", "got [16 0 4]"),
        (
            "(mlp :dims [4 4] :activation :swish)",
            "E-EVAL-007",
            "`:activation` of `mlp` is :gelu, :relu, :silu, :tanh, got :swish",
        ),
        (
            "(layer-norm :dim 4 :eps 0)",
            "E-EVAL-007",
            "`:eps` of `layer-norm` must be positive, got 0",
        ),
        ("(layer-norm :dims 4)", "E-EVAL-005", "`layer-norm` has no keyword `:dims`"),
        (
            "(gpt :vocab 32 :layers 0 :dim 8 :heads 2)",
            "E-EVAL-007",
            "`:layers` of `gpt` must be positive, got 0",
        ),
        ("(sequential)", "E-EVAL-004", "`sequential` takes at least 1 positional"),
        (
            "(sequential (linear :in 2 :out 2) 3)",
            "E-EVAL-007",
            "layer 1 of `sequential` must be a model or a layer, got an integer 3",
        ),
        (
            "(sequential (embedding :vocab 32 :dim 16) (linear :in 8 :out 32))",
            "E-SHAPE-011",
            "layer 1 of `sequential` (`linear`) takes 8 features, "
            "but layer 0 (`embedding`) gives 16 features",
        ),
        (
            "(sequential (linear :in 2 :out 4) (embedding :vocab 4 :dim 2))",
            "E-SHAPE-011",
            "layer 1 of `sequential` (`embedding`) takes integer tokens, "
            "but layer 0 (`linear`) gives 4",
        ),
    ],
)
def test_bad_arguments_are_refused_when_the_file_is_evaluated(
    write, text, code, needle
):
    found, message = refused(write, text)
    assert found == [code] and needle in message


def test_a_model_is_refused_without_flax(write, monkeypatch):
    from jaxnitro.runfile import nn_models

    def missing(*args, **kwargs):
        raise ModuleNotFoundError("No module named 'flax'")

    monkeypatch.setattr(nn_models, "nnx", missing)
    found, message = refused(write, "(linear :in 2 :out 2)")
    assert found == ["E-EVAL-018"]
    assert "`linear` is a Flax NNX model and Flax is not installed" in message
    assert "pip install 'jaxnitro[flax]'" in message


def run_file_text(model_text: str) -> str:
    return MINIMAL.replace(
        "(gpt :vocab 32 :layers 2 :dim 32 :heads 2)", model_text
    ).replace(
        '(require "sexpgpu/nn" cross-entropy gpt)',
        '(require "sexpgpu/nn" cross-entropy gpt embedding linear mlp layer-norm '
        "sequential)",
    )


def test_check_traces_a_sequential_model_and_counts_its_parameters(write):
    report = check_file(write(run_file_text(LAYERED)))
    assert (
        report.parameters == 9
        and report.elements
        == 32 * 16 + 16 * 64 + 64 + 64 * 16 + 16 + 16 + 16 + 16 * 32 + 32
    )


@pytest.mark.parametrize(
    "text, needle",
    [
        (
            "(sequential (linear :in 16 :out 32))",
            "`linear` (layer 0 of `sequential`) takes floats [..., 16], got an array "
            "int32[4, 16]",
        ),
        (
            "(layer-norm :dim 16)",
            "`layer-norm` takes floats [..., 16], got an array int32",
        ),
        ("(mlp :dims [16 32])", "fix: integer tokens go through (embedding ...) first"),
    ],
)
def test_check_refuses_inputs_a_layer_does_not_take(write, text, needle):
    with pytest.raises(RunfileError) as caught:
        check_file(write(run_file_text(text)))
    assert caught.value.codes == ["E-SHAPE-002"] and needle in str(caught.value)


def test_gpt_refuses_float_inputs_and_more_positions_than_its_context(write):
    text = run_file_text("(gpt :vocab 32 :layers 1 :dim 8 :heads 2 :context 8)")
    with pytest.raises(RunfileError) as caught:
        check_file(write(text))
    assert caught.value.codes == ["E-SHAPE-003"]
    assert "`gpt` sees 16 positions but its :context is 8" in str(caught.value)
    text = text.replace(
        ":inputs (slice tokens 1 0 16)", ":inputs (cast (slice tokens 1 0 16) :f32)"
    ).replace(":context 8", ":context 16")
    with pytest.raises(RunfileError) as caught:
        check_file(write(text))
    assert caught.value.codes == ["E-SHAPE-002"]
    assert "`gpt` takes integer tokens [batch, time], got an array float32[4, 16]" in (
        str(caught.value)
    )


def cross_entropy(*values, **kwargs):
    builtin = exports()["cross-entropy"]
    return builtin.impl(list(values), kwargs, None)


def test_cross_entropy_is_the_mean_over_tokens_and_the_per_token_form():
    from jaxnitro.runfile.values import Keyword

    logits = jax.random.normal(jax.random.key(0), (2, 3, 5))
    targets = jnp.array([[0, 4, 2], [1, 1, 3]], jnp.int32)
    log_p = jax.nn.log_softmax(logits)
    per_token = -jnp.take_along_axis(log_p, targets[..., None], -1)[..., 0]
    np.testing.assert_allclose(
        cross_entropy(logits, targets), per_token.mean(), rtol=1e-6
    )
    summed = cross_entropy(logits, targets, reduce=Keyword("sum"))
    np.testing.assert_allclose(summed, per_token.sum(), rtol=1e-6)
    each = cross_entropy(logits, targets, reduce=Keyword("none"))
    assert each.shape == (2, 3)
    np.testing.assert_allclose(each, per_token, rtol=1e-6)
    np.testing.assert_allclose(
        each,
        optax.softmax_cross_entropy_with_integer_labels(logits, targets),
        rtol=1e-6,
    )


@pytest.mark.parametrize(
    "values, kwargs, code, needle",
    [
        (
            (jnp.zeros((2, 3, 5)), jnp.zeros((2, 4), jnp.int32)),
            {},
            "E-SHAPE-005",
            "integer targets [...]: got an array float32[2, 3, 5] and an array "
            "int32[2, 4]",
        ),
        (
            (jnp.zeros((2, 5)), jnp.zeros((2,))),
            {},
            "E-SHAPE-005",
            "fix: the targets are the inputs shifted by one",
        ),
        (
            (jnp.zeros((2, 5)), 3),
            {},
            "E-EVAL-007",
            "`cross-entropy` takes arrays, got an array float32[2, 5] and an integer",
        ),
        (
            (jnp.zeros((2, 5)), jnp.zeros((2,), jnp.int32)),
            {"reduce": "mean"},
            "E-EVAL-007",
            "`:reduce` of `cross-entropy` is :mean, :sum or :none (per token), "
            "got mean",
        ),
    ],
)
def test_cross_entropy_refuses_what_it_cannot_score(values, kwargs, code, needle):
    with pytest.raises(RunfileError) as caught:
        cross_entropy(*values, **kwargs)
    assert caught.value.codes == [code] and needle in str(caught.value)


def test_a_sequential_model_trains_on_the_engine_and_explain_lists_it(tmp_path, capsys):
    import shutil
    from pathlib import Path

    from jaxnitro.cli import main
    from jaxnitro.runfile.running import run_file
    from jaxnitro.runfile.stdlib_nn import flatten

    examples = Path(__file__).parents[2] / "examples" / "runfiles"
    shutil.copy(examples / "data" / "tiny-train.jsonl.gz", tmp_path)
    path = tmp_path / "layers.sx"
    path.write_text(
        run_file_text(LAYERED)
        .replace("data/tiny-train", "tiny-train")
        .replace("(sgd :lr 0.5)", "(sgd :lr 0.5 :momentum 0.9)")
    )
    outcome = run_file(str(path), steps=6, run_dir=str(tmp_path / "run"))
    losses = [row["train_loss"] for row in outcome.handle.history]
    assert outcome.steps == 6 and outcome.train_loss < losses[0]
    trained = flatten(outcome.handle.parameters)
    assert sorted(trained) == sorted(LAYERED_NAMES)
    assert main(["explain", str(path)]) == 0
    out = capsys.readouterr().out
    assert "parameters: 9 arrays, 3216 elements" in out
    assert "  model.1.0.weight  [16, 64]       1024" in out


LAYERED_NAMES = [
    "model.0.weight",
    "model.1.0.weight",
    "model.1.0.bias",
    "model.1.1.weight",
    "model.1.1.bias",
    "model.2.scale",
    "model.2.bias",
    "model.3.weight",
    "model.3.bias",
]
