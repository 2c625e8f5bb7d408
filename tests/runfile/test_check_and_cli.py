"""`sexpgpu check` (shapes, the ok line) and the CLI verbs."""

from __future__ import annotations

from pathlib import Path

import pytest

from jaxnitro.cli import build_parser, main
from jaxnitro.runfile.check import check_file
from jaxnitro.runfile.knobs import Selection
from jaxnitro.runfile.source import RunfileError

from .conftest import MINIMAL

EXAMPLES = Path(__file__).parents[2] / "examples" / "runfiles"


def test_check_prints_the_spec_line_for_the_minimal_example(capsys):
    assert main(["check", str(EXAMPLES / "minimal.sx")]) == 0
    assert capsys.readouterr().out == "ok: 32 parameters, 2 graphs, 20 steps\n"


def test_the_realistic_example_its_variants_sweep_and_groups(capsys):
    path = str(EXAMPLES / "realistic.sx")
    report = check_file(path)
    assert report.parameters == 4 + 14 * 4 and report.steps == 2000
    smoke = check_file(path, Selection(variant="smoke"))
    assert smoke.parameters == 32
    assert {k: len(v) for k, v in smoke.groups.items()} == {
        '(select "model.embed.*")': 2,
        '(select "model.head.weight")': 1,
        "(select :rank-below 2)": 17,
        "default": 12,
    }
    assert main(["check", path, "--variant", "smoke", "--sweep", "seeds"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith("steps (seed=3)")


@pytest.mark.parametrize(
    "edit, code, needle",
    [
        ((":dim 32 :heads 2", ":dim 32 :heads 3"), "E-SHAPE-001", "not divisible"),
        (
            ("(slice tokens 1 0 16)", "(slice tokens 1 0 18)"),
            "E-SHAPE-004",
            "outside an array of shape [4, 17]",
        ),
        (
            ("(field batch :tokens)", "(field batch :token)"),
            "E-LOAD-003",
            "did you mean `tokens`",
        ),
        (
            (":targets (slice tokens 1 1 17)", ":targets (slice tokens 1 0 17)"),
            "E-SHAPE-005",
            "integer targets",
        ),
        (
            ("(cross-entropy prediction targets)", "prediction"),
            "E-SHAPE-008",
            "float scalar",
        ),
        ((":dtype :i32", ":dtype :int32"), "E-LOAD-004", "unknown dtype"),
        (("(list :inputs", "(list :input"), "E-SHAPE-006", ":inputs"),
    ],
)
def test_shape_and_loader_errors(write, edit, code, needle):
    with pytest.raises(RunfileError) as caught:
        check_file(write(MINIMAL.replace(*edit)))
    assert caught.value.codes == [code] and needle in str(caught.value)


def test_check_exit_codes(write, capsys):
    assert main(["check", write(MINIMAL.replace("(sgd :lr 0.5)", "3"))]) == 1
    err = capsys.readouterr().err
    assert "E-CONTRACT-002 `optimizer` is an integer" in err
    assert main(["check", "no-such.sx"]) == 2
    assert main(["check", write(MINIMAL), "--set", "novalue"]) == 2
    with pytest.raises(SystemExit) as usage:
        main(["check"])
    assert usage.value.code == 2


def test_fmt_check_write_and_stdout(write, capsys):
    path = write("(defvar  x   1)\n")
    assert main(["fmt", "--check", path]) == 1
    assert "-(defvar  x   1)\n+(defvar x 1)" in capsys.readouterr().out
    assert main(["fmt", path]) == 0 and capsys.readouterr().out == "(defvar x 1)\n"
    assert Path(path).read_text() == "(defvar  x   1)\n"
    assert main(["fmt", "--write", path]) == 0
    assert Path(path).read_text() == "(defvar x 1)\n"
    assert main(["fmt", "--check", path]) == 0
    assert (
        main(
            [
                "fmt",
                str(EXAMPLES / "minimal.sx"),
                str(EXAMPLES / "realistic.sx"),
                "--check",
            ]
        )
        == 0
    )
    assert main(["fmt", write("(a", "bad.sx")]) == 1
    assert "E-READ-001" in capsys.readouterr().err


@pytest.mark.parametrize("prog", ["nitro", "sexpgpu"])
def test_both_programs_list_the_verbs(prog):
    help_text = build_parser(prog).format_help()
    for verb in ("check", "fmt", "runs", "ckpt"):
        assert f"    {verb} " in help_text
    assert help_text.startswith(f"usage: {prog}")


def test_every_error_code_is_documented_with_an_example():
    import re

    root = Path(__file__).parents[2]
    used = set()
    for path in (root / "src" / "jaxnitro" / "runfile").glob("*.py"):
        used |= set(re.findall(r'"(E-[A-Z]+-\d{3})"', path.read_text()))
    rows = re.findall(
        r"^\| (E-[A-Z]+-\d{3}) \|(.*)\|(.*)\|$",
        (root / "docs" / "runfile.md").read_text(),
        re.M,
    )
    documented = {code for code, _, _ in rows}
    assert len(used) > 50 and used <= documented, used - documented


@pytest.mark.parametrize(
    "text, code, where",
    [
        ("(defvar x " + "(" * 10000 + ")" * 10000 + ")", "E-READ-011", "1:110"),
        ("(defvar x " + "7" * 5000 + ")", "E-READ-012", "1:11"),
    ],
)
@pytest.mark.parametrize("verb", ["check", "fmt", "explain"])
def test_hostile_text_is_a_coded_error_in_every_verb(
    write, capsys, text, code, where, verb
):
    path = write(text)
    assert main([verb, path]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{path}:{where}: {code} ") and "Traceback" not in err
