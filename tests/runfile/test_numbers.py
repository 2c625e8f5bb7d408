"""Numbers out of range: refused as written, as computed and per field, at check;
and `sexpgpu run` ends every user error in a coded message, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from jaxnitro.cli import main
from jaxnitro.runfile import commands
from jaxnitro.runfile.check import check_file
from jaxnitro.runfile.knobs import Selection
from jaxnitro.runfile.reader import read_text
from jaxnitro.runfile.source import RunfileError

from .conftest import MINIMAL

REALISTIC = (
    Path(__file__).parents[2] / "examples" / "runfiles" / "realistic.sx"
).read_text()


def refused(write, text: str, selection: Selection | None = None) -> RunfileError:
    with pytest.raises(RunfileError) as caught:
        check_file(write(text), selection)
    return caught.value


@pytest.mark.parametrize(
    "text, value",
    [
        ("1e999", "1e999"),
        ("-1e400", "-1e400"),
        ("12345678901234567890123456789", "12345678901234567890123456789"),
        ("9223372036854775808", "9223372036854775808"),
        ("-9223372036854775809", "-9223372036854775809"),
    ],
)
def test_a_number_literal_out_of_range_is_refused_where_it_is_written(text, value):
    with pytest.raises(RunfileError) as caught:
        read_text(f"(f\n  {text})", "f.sx")
    assert caught.value.codes == ["E-READ-013"]
    assert str(caught.value).startswith(
        f"f.sx:2:3: E-READ-013 the number `{value}` is out of range"
    )


def test_the_edges_of_the_range_are_numbers():
    forms = read_text("[9223372036854775807 -9223372036854775808 1.7e308]").forms
    assert [a.value for a in forms[0].values] == [2**63 - 1, -(2**63), 1.7e308]


@pytest.mark.parametrize(
    "expression, shown",
    [
        ("(* 1e300 1e300)", "`*` gives inf"),
        ("(- (* 1e300 1e300) (* 1e300 1e300))", "`*` gives inf"),
        ("(+ 9223372036854775807 1)", "`+` gives an integer beyond 64 bits"),
        ("(* 4294967296 4294967296)", "`*` gives an integer beyond 64 bits"),
        ("(- -9223372036854775807 2)", "`-` gives an integer beyond 64 bits"),
        ("(/ 1e-320)", "`/` gives inf"),
    ],
)
def test_arithmetic_out_of_range_is_coded_at_the_call(write, expression, shown):
    text = MINIMAL.replace("(sgd :lr 0.5)", f"(sgd :lr {expression})")
    error = refused(write, text)
    assert error.codes == ["E-EVAL-019"]
    assert shown in str(error) and ":20:" in str(error)


def test_the_issue_s_three_numbers_are_coded_at_check(write):
    # `:lr 1e999`, a NaN learning rate (inf - inf) and a 29-digit seed.
    lr = refused(write, MINIMAL.replace("(sgd :lr 0.5)", "(sgd :lr 1e999)"))
    assert lr.codes == ["E-READ-013"] and ":20:28: E-READ-013" in str(lr)
    nan = MINIMAL.replace(
        "(sgd :lr 0.5)", "(sgd :lr (let ((big (* 1e300 1e300))) (- big big)))"
    )
    assert refused(write, nan).codes == ["E-EVAL-019"]
    seed = refused(write, MINIMAL.replace(":seed 1", ":seed " + "1" * 29))
    assert seed.codes == ["E-READ-013"] and ":22:57: E-READ-013" in str(seed)


@pytest.mark.parametrize(
    "edit, needle, where",
    [
        (
            (":seed 1", ":seed 4294967296"),
            "`:seed` of defrun is 4294967296, outside 0 .. 4294967295: JAX's keys "
            "take 32 bits",
            ":22:57:",
        ),
        (
            (":seed 1", ":seed -3"),
            "`:seed` of defrun is -3, outside 0 .. 4294967295",
            ":22:57:",
        ),
        (
            (":steps 20", ":steps 100000001"),
            "`:steps` is 100000001, outside 1 .. 100000000",
            ":22:16:",
        ),
        (
            (":steps 20", ":steps 10000000 :cadence 2"),
            "`:steps` 10000000 in blocks of `:cadence` 2 makes 5000000 cadence blocks,"
            " over the bound of 1000000",
            ":22:34:",
        ),
        (
            (":microbatches 2", ":microbatches 100000"),
            "`:microbatches` of defrun is 100000, outside 1 .. 65536",
            ":22:33:",
        ),
        (
            (":batch-size 4", ":batch-size 2000000"),
            "`:batch-size` is 2000000, outside 1 .. 1048576",
            ":9:23:",
        ),
        (
            (":shape [17]", ":shape [17 100000000]"),
            "field :tokens of shape [17, 100000000] in batches of 4 holds 6800000000 "
            "elements a batch, over the bound of 2147483647",
            ":9:23:",
        ),
    ],
)
def test_fields_out_of_their_range_name_the_field_value_and_bound(
    write, edit, needle, where
):
    error = refused(write, MINIMAL.replace(*edit))
    assert error.codes == ["E-EVAL-007"]
    assert needle in str(error) and where in str(error).split("\n")[0]


def test_set_of_a_number_out_of_range_is_a_knob_error(write):
    error = refused(write, REALISTIC, Selection(sets=(("lr", "1e999"),)))
    assert error.codes == ["E-KNOB-002"]
    assert "--set lr=1e999: the number `1e999` is out of range" in str(error)
    assert str(error).startswith("command line:1:10: E-KNOB-002 --set lr=1e999")
    assert "fix: `lr` takes a float, such as its default: write --set lr=0.0015" in str(
        error
    )


def test_run_steps_beyond_the_bound_are_refused(write, capsys):
    path = write(MINIMAL)
    assert main(["run", path, "--steps", "200000000", "--run-dir", "unused"]) == 1
    assert "`--steps` is 200000000, outside 1 .. 100000000" in capsys.readouterr().err


@pytest.mark.parametrize(
    "raised, code, status",
    [
        (OSError(28, "No space left on device", "runs/x/ckpt"), "E-RUN-010", 1),
        (MemoryError(), "E-RUN-011", 1),
        (RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating"), "E-RUN-011", 1),
        (RuntimeError("something internal"), "E-INTERNAL-001", 70),
    ],
)
def test_run_codes_what_the_engine_and_the_machine_raise(
    write, capsys, monkeypatch, raised, code, status
):
    import jaxnitro.runfile.running as running

    def fail(*args, **kwargs):
        raise raised

    monkeypatch.setattr(running, "run_file", fail)
    assert main(["run", write(MINIMAL), "--run-dir", "unused"]) == status
    err = capsys.readouterr().err
    assert code in err and "Traceback" not in err
    if code == "E-INTERNAL-001":
        saved = err.split("saved in ")[1].strip()
        assert "RuntimeError: something internal" in Path(saved).read_text()
        Path(saved).unlink()


def test_ctrl_c_ends_run_with_130_and_no_traceback(write, capsys, monkeypatch):
    import jaxnitro.runfile.running as running

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(running, "run_file", interrupted)
    assert main(["run", write(MINIMAL), "--run-dir", "unused"]) == 130
    assert capsys.readouterr().err == "sexpgpu run: interrupted\n"
    assert commands.INTERRUPTED == 130


def test_a_diverged_run_and_a_refused_run_dir_are_coded(tmp_path, capsys):
    examples = Path(__file__).parents[2] / "examples" / "runfiles"
    import shutil

    shutil.copytree(examples / "data", tmp_path / "data")
    path = tmp_path / "run.sx"
    path.write_text(MINIMAL.replace("(sgd :lr 0.5)", "(sgd :lr 1e30)"))
    run_dir = str(tmp_path / "runs")
    argv = ["run", str(path), "--steps", "2", "--device", "cpu", "--run-dir", run_dir]
    assert main(argv) == 1
    err = capsys.readouterr().err
    # Off a terminal the engine's binding report comes first (a log keeps it),
    report, _, err = err.partition(f"E-RUN-008 {path}: ")
    assert report.startswith("jaxnitro binding report for RunfileExperiment\n")
    err = f"E-RUN-008 {path}: " + err  # then the coded error
    assert err.startswith(f"E-RUN-008 {path}: the training diverged: The training ")
    assert "fix: lower the learning rate" in err and "Traceback" not in err
    (tmp_path / "a-file").write_text("")
    argv[-1] = str(tmp_path / "a-file")
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"E-RUN-009 {path}: the engine refused the run: run_dir=")
    assert "is an existing file, not a directory" in err
