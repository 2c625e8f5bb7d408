"""`check` of any gpt size takes seconds (shape inference per block), and
absurd model sizes are coded errors naming the argument and the bound."""

from __future__ import annotations

import time

import pytest

from jaxnitro.runfile import nn_models
from jaxnitro.runfile.check import check_file
from jaxnitro.runfile.evaluator import evaluate_file
from jaxnitro.runfile.nn_layers import LinearSpec, MLPSpec, SequentialSpec
from jaxnitro.runfile.nn_models import ModelSpec
from jaxnitro.runfile.source import RunfileError
from jaxnitro.runfile.stdlib_nn import GPTSpec

from .conftest import MINIMAL


@pytest.mark.parametrize(
    "model",
    [
        GPTSpec(vocab=11, layers=3, dim=8, heads=2, context=6),
        GPTSpec(vocab=5, layers=12, dim=4, heads=1, context=2),
        SequentialSpec(
            (
                GPTSpec(vocab=7, layers=2, dim=4, heads=1, context=3),
                MLPSpec((7, 5, 3), "gelu", True),
                LinearSpec(3, 2, False),
            )
        ),
    ],
)
def test_per_block_parameter_shapes_equal_the_unrolled_model_s(model):
    # ModelSpec.parameter_shapes reads the NNX structure of the whole model.
    whole = ModelSpec.parameter_shapes(model)
    assert list(model.parameter_shapes().items()) == list(whole.items())


def test_check_of_a_deep_gpt_builds_only_one_block(write, monkeypatch):
    built: list[ModelSpec] = []
    structure = nn_models.structure

    def spy(model: ModelSpec) -> nn_models.Structure:
        built.append(model)
        return structure(model)

    monkeypatch.setattr(nn_models, "structure", spy)
    path = write(MINIMAL.replace(":layers 2", ":layers 1024"))
    started = time.perf_counter()
    report = check_file(path)
    took = time.perf_counter() - started
    assert report.parameters == 4 + 14 * 1024
    assert built and all(m.layers == 1 for m in built)  # never the unrolled model
    assert took < 60, f"check of 1024 layers took {took:.1f} s"


@pytest.mark.parametrize(
    "edit, argument, value, bound",
    [
        ((":layers 2", ":layers 100000"), "`:layers` of `gpt`", 100000, 1024),
        ((":dim 32", ":dim 131072"), "`:dim` of `gpt`", 131072, 65536),
        ((":vocab 32", ":vocab 100000000"), "`:vocab` of `gpt`", 100000000, 4194304),
        (
            (":heads 2", ":heads 2 :context 2000000"),
            "`:context` of `gpt`",
            2000000,
            1048576,
        ),
    ],
)
def test_an_absurd_gpt_size_is_coded_at_its_value(write, edit, argument, value, bound):
    with pytest.raises(RunfileError) as caught:
        check_file(write(MINIMAL.replace(*edit)))
    assert caught.value.codes == ["E-SHAPE-012"]
    first, line, underline, fix = str(caught.value).split("\n")
    assert f"E-SHAPE-012 {argument} is {value}, over the bound of {bound}" in first
    assert line[underline.index("^") :].startswith(str(value))
    assert fix == f"  fix: use at most {bound}"


@pytest.mark.parametrize(
    "model, argument",
    [
        ("(linear :in 16 :out 5000000)", "`:out` of `linear`"),
        ("(embedding :vocab 32 :dim 100000)", "`:dim` of `embedding`"),
        ("(mlp :dims [16 5000000 16])", "a size in `:dims` of `mlp`"),
        ("(layer-norm :dim 5000000)", "`:dim` of `layer-norm`"),
    ],
)
def test_an_absurd_layer_size_is_coded(write, model, argument):
    text = '(require "sexpgpu/nn" embedding linear mlp layer-norm)\n'
    with pytest.raises(RunfileError) as caught:
        evaluate_file(write(text + f"(defvar x {model})"))
    assert caught.value.codes == ["E-SHAPE-012"]
    assert f"{argument} is " in str(caught.value)


def test_a_model_too_large_in_all_is_coded_at_its_definition(write):
    text = MINIMAL.replace(":layers 2 :dim 32", ":layers 1024 :dim 65536")
    with pytest.raises(RunfileError) as caught:
        check_file(write(text))
    assert caught.value.codes == ["E-SHAPE-012"]
    assert (
        ":16:9: E-SHAPE-012 `model` holds 52777367699456 parameter elements, over "
        in (str(caught.value))
    )
