"""The MNIST tutorial example, end to end: trained on an MNIST directory, and run as
a script in its smoke mode."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from example_scripts import example_module
from fake_mnist import fake_mnist

import jaxnitro as nx

pytestmark = pytest.mark.slow  # trains the tutorial, in process and as a script

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mnist_tutorial.py"


@pytest.fixture(scope="module")
def tutorial():
    """The example script as a module."""
    with example_module("mnist_tutorial.py", "mnist_tutorial") as module:
        yield module


def test_tutorial_trains_on_an_mnist_directory(tutorial, tmp_path, monkeypatch):
    # 1200 training images: 1100 train (22 batches of 50, an even count for accum 2)
    # and 100 val; 130 test images end in a short batch that is padded.
    arrays = fake_mnist(tmp_path / "mnist", 1200, 130, gz=True)
    monkeypatch.setenv("NITRO_MNIST_DIR", str(tmp_path / "mnist"))
    run_dir = tmp_path / "run"
    nitro = nx.Nitro(tutorial.MnistMLP(max_epochs=1), run_dir=str(run_dir))
    assert nitro.experiment.mnist_dir == str(tmp_path / "mnist")
    counts = np.bincount(arrays["train_labels"][:1100], minlength=10)
    np.testing.assert_allclose(
        nitro.device_value("class_weights"), 1100 / (10 * counts), rtol=1e-6
    )

    nitro.train()
    assert [row["epoch"] for row in nitro.history] == [1]
    assert np.isfinite(nitro.history[1]["train_loss"])  # epoch 1
    assert (run_dir / "manifest.json").exists()
    assert nx.read_manifest(str(run_dir))
    test = nitro.evaluate(split="test")
    assert 0.0 <= test["acc"] <= 1.0 and 0.0 <= test["macro_recall"] <= 1.0

    images = arrays["test_images"][:3].reshape(3, -1).astype(np.float32) / 255
    before = nx.cache_stats()
    nitro.set_device(temperature=2.0)
    assert nitro.predict({"img": images}).shape == (3, 10)
    assert nx.cache_stats()["misses"] == before["misses"]


# The script, with a copy of its smoke run's temporary directory kept for the test
# at the moment the framework removes it (when the handle goes, at the latest at exit).
KEEPING = """
import runpy, shutil, sys
import jaxnitro.run.handle as handle
from jaxnitro.run import smoke

def keep_then_remove(status, path):
    shutil.copytree(path, sys.argv[2])
    smoke.remove_smoke_run_dir(status, path)

handle.remove_smoke_run_dir = keep_then_remove
runpy.run_path(sys.argv[1], run_name="__main__")
"""


@pytest.mark.needs_processes
def test_tutorial_script_runs_in_smoke_mode(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "NITRO_MNIST_DIR"}
    temp = tmp_path / "tmp"
    temp.mkdir()
    env.update(
        NITRO_SMOKE="1",
        NITRO_RUN_DIR=str(tmp_path / "never-written"),
        JAXNITRO_COMPILATION_CACHE="off",
        TMPDIR=str(temp),
    )
    kept = tmp_path / "kept"
    done = subprocess.run(
        [sys.executable, "-c", KEEPING, str(EXAMPLE), str(kept)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "test accuracy: " in done.stdout
    # The framework's smoke run: a temporary run directory, reported at the end,
    # and gone once the script is.
    assert not (tmp_path / "never-written").exists()
    assert "smoke run: 1 epoch in " in done.stderr
    assert "train: 2 of 24 batches, 1 optimizer steps" in done.stderr
    smoke_dir = Path(re.search(r"^run directory: (\S+)$", done.stdout, re.M).group(1))
    assert smoke_dir.name.startswith("nitro-smoke-") and smoke_dir.parent == temp
    assert not smoke_dir.exists() and list(temp.iterdir()) == []
    run_dir = kept  # what it held, copied as it was removed
    assert (run_dir / "manifest.json").exists()
    # It ends by exporting its model and checking the loaded bundle against predict.
    assert "bundle agrees with predict" in done.stdout
    # The binding report is shown once, by setup (on stderr off a terminal), not
    # printed a second time; the run's directory and best record close it.
    assert "binding report" not in done.stdout
    assert done.stderr.count("jaxnitro binding report for MnistMLP") == 1
    best = re.search(
        r"^best checkpoint: (\S+) \(epoch 1, macro_recall ", done.stdout, re.M
    )
    assert best is not None and Path(best.group(1)).parent == smoke_dir
    recorded = {entry.file for entry in nx.read_manifest(str(run_dir))}
    assert Path(best.group(1)).name in recorded
    # Off a terminal, one summary line per epoch on stderr.
    assert re.search(r"^epoch 1/1: train_loss \S+ · val acc \S+ · ", done.stderr, re.M)
    (bundle,) = (run_dir / "export").glob("*/mnist")
    assert nx.load_bundle(bundle).manifest["batch_sizes"] == [1, 8]
    # The spec's log_confusion recipe: stashed in finalize_metrics, logged by a
    # phase monitor on the transition out of validation.
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    confusion = [json.loads(x) for x in lines if '"type": "confusion"' in x]
    assert len(confusion) == 1 and confusion[0]["epoch"] == 1
    matrix = np.asarray(confusion[0]["matrix"])
    assert matrix.shape == (10, 10) and matrix.sum() == 100  # 2 val batches of 50
