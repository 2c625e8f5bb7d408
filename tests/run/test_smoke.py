"""Smoke runs: smoke=True or NITRO_SMOKE=1."""

import gc
import json
import os
import subprocess
import sys
import tempfile

import pytest
from experiments import Tiny, make_batches

import jaxnitro as nx
from jaxnitro.run import smoke


class Loud(Tiny):
    """Its own logger and checkpointer, which a smoke run must not construct."""

    max_epochs: int = 40

    def logger(self):
        raise AssertionError("a smoke run constructed the experiment's logger")

    def checkpointer(self):
        return nx.Checkpointer(dir="/nonexistent/never-written")

    def build_data(self, dist):
        return {
            "train": make_batches(160, 16),  # 10 batches
            "val": make_batches(48, 16, seed=1),  # 3
            "test": make_batches(40, 16, seed=2),  # 3
        }


def test_a_smoke_run_trains_two_batches_validates_checkpoints_in_a_temp_dir(
    tmp_path, capsys
):
    nitro = nx.Nitro(Loud(), smoke=True, run_dir=str(tmp_path / "real"))
    config = nitro.config
    assert config.smoke and config.sources["smoke"] == "keyword"
    assert (config.max_epochs, config.sources["max_epochs"]) == (1, "smoke")
    assert os.path.basename(config.run_dir).startswith("nitro-smoke-")
    assert config.sources["logger"] == config.sources["checkpointer"] == "smoke"
    assert {name: len(split) for name, split in nitro.data.items()} == {
        "train": 2,
        "val": 2,
        "test": 2,
    }
    nitro.train()
    assert nitro.current_step == 2 and nitro.current_epoch == 1
    assert not (tmp_path / "real").exists()  # the real run directory is untouched
    records = [f for f in os.listdir(config.run_dir) if f.endswith(".safetensors")]
    assert len(records) == 1
    with open(nitro.logger.path) as lines:
        log = [json.loads(line) for line in lines]
    assert any(row.get("context") == "validate" for row in log)
    report = capsys.readouterr().err
    assert f"smoke run: 1 epoch in {config.run_dir}" in report
    assert "train: 2 of 10 batches, 2 optimizer steps, train loss" in report
    assert "val: 2 of 3 batches, validated: loss" in report
    assert "test: 2 of 3 batches" in report
    assert f"checkpoint: {os.path.join(config.run_dir, records[0])}" in report
    assert "compiled: train_step" in report
    assert nitro.evaluate("test")  # the cut test split evaluates too


def test_nitro_smoke_from_the_environment_and_off_switches(monkeypatch):
    monkeypatch.setenv("NITRO_SMOKE", "1")
    nitro = nx.Nitro(Loud(), logger=None, checkpointer=None)
    assert nitro.config.smoke and nitro.config.sources["smoke"] == "environment"
    assert nitro.logger is None and nitro.checkpointer is None  # kept off
    assert nx.Nitro(Tiny(), smoke=False, logger=None).config.smoke is False
    monkeypatch.setenv("NITRO_SMOKE", "maybe")
    with pytest.raises(nx.ConfigError, match="NITRO_SMOKE='maybe': set it to 1"):
        nx.Nitro(Tiny(), logger=None)


def test_with_accumulation_a_smoke_run_trains_one_whole_optimizer_step():
    nitro = nx.Nitro(Loud(), smoke=True, accum=4, logger=None, checkpointer=None)
    assert len(nitro.data["train"]) == 4
    nitro.train()
    assert nitro.current_step == 1


def test_smoke_must_be_a_bool():
    with pytest.raises(nx.ConfigError, match="smoke must be True or False, got 1"):
        nx.Nitro(Tiny(), smoke=1)


@pytest.fixture
def temp_dir(tmp_path, monkeypatch):
    """A temporary directory of the test's own, as TMPDIR names it."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    assert tempfile.gettempdir() == str(tmp)
    return tmp


def smoke_dirs() -> list[str]:
    return [
        n for n in os.listdir(tempfile.gettempdir()) if n.startswith("nitro-smoke-")
    ]


def test_a_smoke_run_leaves_no_temporary_directory_behind(temp_dir, capsys):
    nitro = nx.Nitro(Loud(), smoke=True)
    nitro.train()
    run_dir = nitro.run_dir
    assert smoke_dirs() == [os.path.basename(run_dir)]  # there while the handle is
    assert os.listdir(run_dir)  # its checkpoint and log, to look at meanwhile
    report = capsys.readouterr().err
    assert f"{run_dir} (a temporary directory, removed with this handle" in report
    del nitro
    gc.collect()
    assert smoke_dirs() == []


def test_a_smoke_run_whose_setup_fails_leaves_nothing_at_exit(temp_dir):
    class Broken(Tiny):
        def build_model(self, rng):
            raise RuntimeError("no model today")

    with pytest.raises(RuntimeError, match="no model today"):
        nx.Nitro(Broken(), smoke=True)
    assert len(smoke_dirs()) == 1  # no handle to drop: the exit hook removes it
    smoke._remove_all()  # what atexit runs
    assert smoke_dirs() == []


SCRIPT = """
import sys
sys.path.insert(0, sys.argv[1])
import jaxnitro as nx
from experiments import Tiny

nx.Nitro(Tiny(), run_dir="never-used").train()
"""


@pytest.mark.needs_processes
@pytest.mark.slow  # a process of its own
def test_nitro_smoke_1_in_a_script_leaves_no_temporary_directory(temp_dir, tmp_path):
    import experiments

    support = os.path.dirname(os.path.abspath(experiments.__file__))
    env = dict(os.environ, NITRO_SMOKE="1", TMPDIR=str(temp_dir))
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, support],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "smoke run: 1 epoch in " + str(temp_dir) in done.stderr
    assert smoke_dirs() == []
    assert not (tmp_path / "never-used").exists()
