"""`sexpgpu run --resume auto`, and what a run says of a run dir's earlier runs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from jaxnitro.cli import main
from jaxnitro.runfile.rundir import RUNS_FILE, RunsFile, plan_start, runs_in

from .conftest import MINIMAL

EXAMPLES = Path(__file__).parents[2] / "examples" / "runfiles"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    shutil.copytree(EXAMPLES / "data", tmp_path / "data")
    (tmp_path / "run.sx").write_text(MINIMAL)
    return tmp_path


def run(folder: Path, capsys, *args: str) -> list[str]:
    argv = ["run", str(folder / "run.sx"), "--run-dir", str(folder / "runs"), *args]
    assert main(argv) == 0, capsys.readouterr().err
    return capsys.readouterr().out.splitlines()


def test_resume_auto_continues_the_latest_run_of_the_file(folder, capsys):
    first = run(folder, capsys, "--steps", "2")
    assert first[-3] == "done: 2 steps, train/loss " + first[-3].split()[-1]
    [only] = runs_in(str(folder / "runs"))
    assert (only.step, only.file) == (2, str(folder / "run.sx"))
    again = run(folder, capsys, "--steps", "4", "--resume", "auto")
    assert again[0] == f"resuming run {only.run} of run.sx at step 2 ({folder}/runs)"
    assert again[-3].startswith("done: 4 steps, train/loss ")
    assert "counter records 32" in again[-2]  # steps x microbatches x batch, all 4
    done = run(folder, capsys, "--steps", "4", "--resume", "auto")
    assert done[:2] == [
        f"resuming run {only.run} of run.sx at step 4 ({folder}/runs)",
        "the run is already at step 4 of 4: nothing to train (--steps N trains it "
        "on to step N)",
    ]
    assert done[2] == "done: 4 steps, nothing trained"


def test_a_new_run_says_what_the_run_dir_already_holds(folder, capsys):
    run(folder, capsys, "--steps", "2")
    path, runs = str(folder / "run.sx"), str(folder / "runs")
    start = plan_start(path, runs, resume=False)
    assert start.resume is False
    assert start.lines == (
        f"{runs} already holds 1 run of run.sx (the latest checkpoint at step 2); "
        "this run starts a new one from step 0: pass --resume auto to continue the "
        "latest",
    )
    (folder / "run.sx").write_text(MINIMAL.replace(":lr 0.5", ":lr 0.25"))
    changed = plan_start(path, runs, resume=True)
    assert changed.resume == (runs_in(runs)[0].run, "latest")
    assert changed.lines[0].endswith(f"at step 2 ({runs}; run.sx has changed since)")
    # Another file in the same run dir: told, and never resumed from this one.
    (folder / "other.sx").write_text(MINIMAL)
    other = plan_start(str(folder / "other.sx"), runs, resume=True)
    assert other.resume is False
    assert other.lines == (
        f"{runs} also holds runs of other files (run.sx); --resume auto never "
        "continues them",
        f"--resume auto: {runs} holds no run of other.sx; starting a new run",
    )


def test_resume_auto_in_an_empty_run_dir_starts_a_new_run(folder, capsys):
    lines = run(folder, capsys, "--steps", "2", "--resume", "auto")
    assert lines[0] == (
        f"--resume auto: {folder}/runs holds no run of run.sx; starting a new run"
    )
    assert lines[-3].startswith("done: 2 steps")


def test_a_run_no_file_claims_is_resumed_and_said_so(folder, capsys):
    run(folder, capsys, "--steps", "2")
    (folder / "runs" / RUNS_FILE).unlink()  # a run from before files were noted
    runs = str(folder / "runs")
    assert RunsFile(runs).read() == {}
    start = plan_start(str(folder / "run.sx"), runs, resume=True)
    [only] = runs_in(runs)
    assert start.resume == (only.run, "latest") and only.file is None
    assert "no file is noted for it" in start.lines[0]
    fresh = plan_start(str(folder / "run.sx"), runs, resume=False)
    assert fresh.lines[0].startswith(f"{runs} already holds 1 run no file is noted")


def test_a_damaged_runs_file_reads_as_none(tmp_path):
    (tmp_path / RUNS_FILE).write_text("{not json")
    assert RunsFile(str(tmp_path)).read() == {}
    (tmp_path / RUNS_FILE).write_text('{"runs": [1, 2]}')
    assert RunsFile(str(tmp_path)).read() == {}
