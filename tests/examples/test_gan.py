"""The manual-mode GAN example: it learns where the mixture is, and its script runs
in smoke mode."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from example_scripts import example_module

import jaxnitro as nx

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gan.py"


@pytest.fixture(scope="module")
def gan():
    """The example script as a module."""
    with example_module("gan.py", "gan_example") as module:
        yield module


def test_the_generator_moves_its_points_onto_the_mixture(gan):
    nitro = nx.Nitro(gan.MixtureGAN(), logger=None, checkpointer=None)
    untrained = nitro.validate()["loss"]
    assert untrained > 1.5  # near the origin, about 2 from every centre
    nitro.train()
    trained = nitro.history[20]["loss"]
    # The generated points end at least three times closer to the nearest centre.
    assert trained < untrained / 3
    assert nitro.train_state.opt_state["gen"].inner[0].count == 20 * 32


@pytest.mark.needs_processes
@pytest.mark.slow
def test_the_script_runs_in_smoke_mode(tmp_path):
    env = {
        **os.environ,
        "NITRO_EXAMPLE_EPOCHS": "1",
        "NITRO_RUN_DIR": str(tmp_path / "run"),
    }
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "distance to the nearest centre: untrained" in done.stdout
    assert (tmp_path / "run" / "manifest.json").is_file()
