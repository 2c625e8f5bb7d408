"""Nothing silently ignored: a group that updates nothing, `:infinite false`."""

from __future__ import annotations

from pathlib import Path

import pytest

from jaxnitro.runfile.check import check_file
from jaxnitro.runfile.curriculum import decode, encode, stage_settings
from jaxnitro.runfile.evaluator import evaluate_file
from jaxnitro.runfile.knobs import Selection
from jaxnitro.runfile.source import RunfileError

from .conftest import MINIMAL

REALISTIC = (
    Path(__file__).parents[2] / "examples" / "runfiles" / "realistic.sx"
).read_text()
SMOKE = Selection(variant="smoke")


def refused(write, text: str) -> RunfileError:
    with pytest.raises(RunfileError) as caught:
        check_file(write(text), SMOKE)
    return caught.value


@pytest.mark.parametrize(
    "old, new, message, fix, where",
    [
        (
            '(select "model.embed.*")',
            '(select "model.embd.*")',
            'group 1\'s (select "model.embd.*") matches no parameter of the model; '
            "the nearest: model.embed.*, ",
            'did you mean "model.embed.*"?',
            ":69:34:",
        ),
        (
            '(select "model.head.weight")',
            '(select "model.head.weigth")',
            'group 2\'s (select "model.head.weigth") matches no parameter of the '
            "model; the nearest: model.head.weight",
            'did you mean "model.head.weight"?',
            ":73:34:",
        ),
        (
            "(select :rank-below 2)",
            "(select :rank-below 1)",
            "group 3's (select :rank-below 1) matches no parameter: the model's "
            "parameters have rank 1 or more",
            "use :rank-below 2 to select the rank-1 ones",
            ":77:46:",
        ),
        (
            '(select "model.head.weight")',
            '(select "model.embed.*")',
            'group 2 repeats group 1\'s (select "model.embed.*")',
            "merge the two groups' settings into one",
            ":73:34:",
        ),
        (
            '(select "model.head.weight")',
            '(select "model.embed.token")',
            'group 2\'s (select "model.embed.token") selects 1 parameter, all held '
            'by group 1\'s (select "model.embed.*"): it updates nothing',
            "move it before group 1, or remove it",
            ":73:34:",
        ),
    ],
)
def test_a_group_that_updates_nothing_is_coded(write, old, new, message, fix, where):
    error = refused(write, REALISTIC.replace(old, new))
    assert error.codes == ["E-CONTRACT-003"]
    rendered = str(error)
    assert message in rendered and f"fix: {fix}" in rendered
    assert where + " E-CONTRACT-003" in rendered.split("\n")[0]


def test_every_group_error_is_reported_at_once(write):
    text = REALISTIC.replace('(select "model.embed.*")', '(select "model.embd.*")')
    text = text.replace("(select :rank-below 2)", "(select :rank-below 1)")
    assert refused(write, text).codes == ["E-CONTRACT-003", "E-CONTRACT-003"]


def test_explain_and_run_refuse_it_too(write, capsys):
    from jaxnitro.cli import main

    path = write(REALISTIC.replace('"model.embed.*"', '"model.embd.*"'))
    for verb in ("explain", "run"):
        assert main([verb, path, "--variant", "smoke"]) == 1  # before any run dir
        assert "E-CONTRACT-003" in capsys.readouterr().err


def test_infinite_false_on_the_train_loader_is_refused_at_the_value(write):
    text = MINIMAL.replace(":infinite true", ":infinite false")
    with pytest.raises(RunfileError) as caught:
        check_file(write(text))
    assert caught.value.codes == ["E-LOAD-012"]
    first, line, underline, fix = str(caught.value).split("\n")
    assert first.endswith(
        ":10:21: E-LOAD-012 train-loader is :infinite false, but a run is defrun's "
        ":steps long: the train loader streams its records pass after pass (each a "
        "new order)"
    )
    assert line.strip() == ":infinite false))" and underline.endswith("^~~~~")
    assert "write :infinite true, or leave it out" in fix


def test_infinite_is_optional_and_a_pass_reads_its_loader_once(write):
    text = MINIMAL.replace("\n          :infinite true", "")
    assert check_file(write(text)).steps == 20
    # A pass's loader reads each record at most once whatever it says.
    passes = MINIMAL.replace(
        "(defun prepare",
        '(defeval valid :loader (loader :sources [(files ["v.jsonl"])] '
        ':fields [(field :tokens :from "input_ids" :dtype :i32 :shape [17])] '
        ":batch-size 4 :infinite false))\n\n(defun prepare",
    ).replace(
        "(defvar optimizer",
        "(defun evaluate (p t) (list :loss (cross-entropy p t)))\n\n(defvar optimizer",
    )
    assert check_file(write(passes)).graphs == 3


def test_a_stage_loader_that_is_not_infinite_is_refused_and_a_stage_keeps_its_loader(
    write,
):
    result = evaluate_file(
        write(
            MINIMAL + '(defvar once (loader :sources [(files ["a.jsonl"])] :fields '
            '[(field :tokens :from "input_ids" :dtype :i32 :shape [17])] '
            ":batch-size 4 :infinite false))\n"
        )
    )
    train, once = result.value("train-loader"), result.value("once")
    with pytest.raises(RunfileError) as caught:
        stage_settings(encode_stage(once), train, None)
    assert caught.value.codes == ["E-LOAD-012"]
    assert "the curriculum's stage loader is :infinite false" in str(caught.value)
    assert decode(encode(train)) == train  # the stage file round trip


def encode_stage(loader):
    from jaxnitro.runfile.values import Keyword

    return (Keyword("loader"), loader)
