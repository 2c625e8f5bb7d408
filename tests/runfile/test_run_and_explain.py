"""`sexpgpu run` and `sexpgpu explain`: what they print, in process and as commands."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from process_jobs import child_path

from jaxnitro.cli import main

EXAMPLES = Path(__file__).parents[2] / "examples" / "runfiles"


@pytest.fixture
def examples(tmp_path):
    """The example run files and their data, in a folder of the test's own."""
    for name in ("minimal.sx", "realistic.sx"):
        shutil.copy(EXAMPLES / name, tmp_path / name)
    shutil.copytree(EXAMPLES / "data", tmp_path / "data")
    return tmp_path


def test_explain_reads_the_realistic_smoke_variant_back(examples, capsys):
    assert main(["explain", str(examples / "realistic.sx"), "--variant", "smoke"]) == 0
    out = capsys.readouterr().out
    assert "parameters: 32 arrays, 13282176 elements" in out
    assert "model.head.weight                 [128, 50304]   6438912" in out
    assert "update groups (adamw): 4" in out
    assert '  group-1 (select "model.embed.*"): 2 parameters, 6447104 elements' in out
    assert "  group-3 (select :rank-below 2): 17 parameters, 2944 elements" in out
    assert "  default: 12 parameters, 393216 elements" in out
    assert "states m, v (393216 elements each) and a step count" in out
    assert (
        "lr warmup-stable-decay, peak 0.003125, warmup 25 steps, stable to step 600, "
        "linear to 0 at step 2000" in out
    )
    assert "betas 0.9 0.95, eps 1e-10, weight-decay 0.1" in out
    assert (
        "step: 4 micro-batches of 8 records (32 records a step), precision bf16" in out
    )
    assert "run: 2000 steps in 40 cadence blocks of 50 steps" in out
    assert (
        "evaluation pass valid: 16 batches of 8 records every 100 steps and after "
        "the last" in out
    )
    assert "  lr 0.0015: run value" in out and "  seed 1: run value" in out
    assert "  layers 2: graph constant" in out and "  seq 64: graph constant" in out


def test_run_refuses_a_bad_set_and_a_missing_file(examples, capsys):
    path = str(examples / "minimal.sx")
    assert main(["run", path, "--set", "lr"]) == 2
    assert "--set takes KNOB=VALUE" in capsys.readouterr().err
    assert main(["run", str(examples / "nope.sx")]) == 2
    assert main(["run", path, "--set", "lr=1"]) == 1
    assert "E-KNOB-003" in capsys.readouterr().err


def sexpgpu(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": child_path()}
    return subprocess.run(
        [sys.executable, "-m", "jaxnitro.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_sexpgpu_run_minimal_three_steps_ends_with_the_counters(examples):
    done = sexpgpu("run", "minimal.sx", "--steps", "3", "--device", "cpu", cwd=examples)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[-3].startswith("done: 3 steps, train/loss ")
    assert lines[-2:] == ["  counter records 24", "  counter tokens 408"]
    assert (examples / "runs" / "minimal" / "metrics.jsonl").is_file()


@pytest.mark.slow
def test_sexpgpu_run_realistic_smoke_30_steps_on_cpu(examples):
    done = sexpgpu(
        "run", "realistic.sx", "--variant", "smoke", "--steps", "30",
        "--device", "cpu", "--run-dir", "smoke", cwd=examples,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    last = done.stdout.splitlines()[-3]
    assert last.startswith("done: 30 steps, train/loss ")
    per_token = float(last.rsplit(" ", 1)[1]) / (8 * 64)  # the objective sums
    assert per_token < 10.0  # below ln(50304) = 10.83 of the uniform start
    assert done.stdout.splitlines()[-2:] == [
        "  counter records 960",
        "  counter tokens 62400",
    ]
    log = (examples / "smoke" / "metrics.jsonl").read_text()
    assert '"context": "validate"' in log and '"valid/loss"' in log


@pytest.mark.needs_processes
@pytest.mark.slow
def test_sexpgpu_run_a_sweep_runs_every_point_in_its_own_directory(examples):
    done = sexpgpu(
        "run", "minimal.sx", "--steps", "2", "--sweep", "seeds", "--run-dir", "sw",
        cwd=examples,
    )  # fmt: skip
    # minimal.sx has no sweep: the error is coded and names the sweep
    assert done.returncode == 1 and "E-KNOB-005" in done.stderr
    text = (examples / "minimal.sx").read_text()
    text = text.replace(
        "(defvar train-loader",
        '(defknobs (seed 1 "the run seed"))\n(defsweep seeds (seed [1 2]))\n\n'
        "(defvar train-loader",
    ).replace(":seed 1)", ":seed seed)")
    (examples / "swept.sx").write_text(text)
    done = sexpgpu("run", "swept.sx", "--steps", "2", "--sweep", "seeds",
                   "--run-dir", "sw", cwd=examples)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "sweep seeds: 2 runs" in done.stdout
    assert sorted(p.name for p in (examples / "sw").iterdir()) == ["seed=1", "seed=2"]
