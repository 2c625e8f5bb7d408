"""Error locations: a builtin's error points at the value it refuses; a command
line's variant, knob or sweep at its use there; counts are singular or plural."""

from __future__ import annotations

import pytest

from jaxnitro.cli import main
from jaxnitro.runfile.check import check_file
from jaxnitro.runfile.knobs import Selection
from jaxnitro.runfile.source import RunfileError

from .conftest import MINIMAL
from .test_contract_and_knobs import KNOBS


def refused(path: str, selection: Selection | None = None) -> RunfileError:
    with pytest.raises(RunfileError) as caught:
        check_file(path, selection)
    return caught.value


@pytest.mark.parametrize(
    "edit, code, where, underlined",
    [
        ((":batch-size 4", ":batch-size 0"), "E-EVAL-007", "9:23", "0"),
        ((":batch-size 4", ':batch-size "4"'), "E-EVAL-007", "9:23", '"4"'),
        ((":dtype :i32", ":dtype :int32"), "E-LOAD-004", "8:60", ":int32"),
        ((":shape [17]", ":shape [0]"), "E-LOAD-005", "8:72", "["),
        ((":heads 2", ":heads 3"), "E-SHAPE-001", "16:55", "3"),
        ((":layers 2", ":layers -2"), "E-EVAL-007", "16:38", "-2"),
        (("(sgd :lr 0.5)", "(sgd :lr -1)"), "E-EVAL-007", "20:28", "-1"),
        ((":seed 1", ":seed 1.5"), "E-EVAL-007", "22:57", "1.5"),
        ((":precision :f32", ":precision :f8"), "E-EVAL-007", "22:46", ":f8"),
        (
            ("(field batch :tokens)", "(field batch :token)"),
            "E-LOAD-003",
            "13:30",
            ":token",
        ),
        (
            ("(slice tokens 1 0 16)", "(slice tokens 1.5 0 16)"),
            "E-EVAL-007",
            "14:33",
            "1.5",
        ),
    ],
)
def test_a_builtin_points_at_the_value_it_refuses(write, edit, code, where, underlined):
    error = refused(write(MINIMAL.replace(*edit)))
    assert error.codes == [code]
    first, line, underline = str(error).split("\n")[:3]
    assert f":{where}: {code} " in first
    at = underline.index("^") - 2
    assert line[2 + at :].startswith(underlined)


def test_an_unknown_variant_points_at_its_use_and_suggests_the_nearest(write):
    path = write(KNOBS.replace("(defvariant small", "(defvariant tiny"))
    error = refused(path, Selection(variant="tinny"))
    assert error.codes == ["E-KNOB-004"]
    assert str(error) == (
        "command line:1:11: E-KNOB-004 no variant `tinny` (the file declares tiny)\n"
        "  --variant tinny\n"
        "            ^~~~~\n"
        "  fix: did you mean `tiny`?"
    )


def test_an_unknown_knob_points_at_its_name_and_an_unknown_sweep_at_its_use(write):
    error = refused(write(KNOBS), Selection(sets=(("layer", "3"),)))
    assert str(error).split("\n")[:3] == [
        "command line:1:7: E-KNOB-003 --set layer=3: no knob `layer` (the knobs are "
        "layers lr mode)",
        "  --set layer=3",
        "        ^~~~~",
    ]
    from jaxnitro.runfile.check import evaluate_checked

    with pytest.raises(RunfileError) as caught:
        evaluate_checked(write(KNOBS)).knobs.points("grd")
    assert str(caught.value).startswith("command line:1:9: E-KNOB-005 no sweep `grd`")


@pytest.mark.parametrize(
    "knob, text, fix",
    [
        (
            "layers",
            "2.5",
            "`layers` takes an integer: write --set layers=2 or --set "
            "layers=3 (its default is 2)",
        ),
        (
            "layers",
            "many",
            "`layers` takes an integer, such as its default: write --set layers=2",
        ),
        ("lr", "fast", "`lr` takes a float, such as its default: write --set lr=0.5"),
        (
            "mode",
            "slow",
            "`mode` takes a keyword, which starts with `:`: write --set "
            "mode=:slow (its default is :fast)",
        ),
    ],
)
def test_a_set_of_the_wrong_type_points_at_the_value_and_suggests_one(
    write, knob, text, fix
):
    error = refused(write(KNOBS), Selection(sets=((knob, text),)))
    assert error.codes == ["E-KNOB-002"]
    first, line, underline, shown = str(error).split("\n")
    assert first.startswith(f"command line:1:{8 + len(knob)}: E-KNOB-002 --set ")
    assert line == f"  --set {knob}={text}"
    assert underline == " " * (9 + len(knob)) + "^" + "~" * (len(text) - 1)
    assert shown == f"  fix: {fix}"


def test_counts_are_singular_and_plural(write, capsys):
    one = MINIMAL.replace(":steps 20 :microbatches 2", ":steps 1 :microbatches 1")
    one = one.replace(":batch-size 4", ":batch-size 1")
    path = write(one)
    assert main(["check", path]) == 0
    assert capsys.readouterr().out == "ok: 32 parameters, 1 graph, 1 step\n"
    assert main(["explain", path]) == 0
    out = capsys.readouterr().out
    assert "step: 1 micro-batch of 1 record (1 record a step), precision f32" in out
    assert (
        "run: 1 step in 1 cadence block of 1 step (engine epochs; the last of 1)" in out
    )
    two = write(MINIMAL, "two.sx")
    assert main(["check", two]) == 0
    assert capsys.readouterr().out == "ok: 32 parameters, 2 graphs, 20 steps\n"
