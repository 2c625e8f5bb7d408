"""The README's Python blocks run as written: copied into a file, they train."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import jaxnitro as nx

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_the_quick_start_runs_as_written_and_learns(tmp_path, monkeypatch):
    quick_start = python_blocks()[0]
    (tmp_path / "readme_quick_start.py").write_text(quick_start)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        module = importlib.import_module("readme_quick_start")  # trains, as a file
        nitro = module.nitro
        assert nitro.current_epoch == 3
        assert nitro.history[3]["acc"] > max(nitro.history[1]["acc"], 0.9)
        out = nitro.predict({"img": module.new_images})
        assert out.shape == (5, 10) and out.dtype == np.float32
        assert (tmp_path / "runs/classifier/manifest.json").is_file()
    finally:
        sys.modules.pop("readme_quick_start", None)


def marked_block(marker: str) -> str:
    """The README's one Python block whose first line is `# readme: <marker>`."""
    (block,) = [b for b in python_blocks() if b.startswith(f"# readme: {marker}\n")]
    return block


def run_block(marker: str, tmp_path, monkeypatch):
    name = "readme_" + marker.replace("-", "_")
    (tmp_path / f"{name}.py").write_text(marked_block(marker))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        return importlib.import_module(name)  # trains, as a file
    finally:
        sys.modules.pop(name, None)


def test_the_flax_nnx_example_runs_and_keeps_batchnorm_statistics(
    tmp_path, monkeypatch
):
    module = run_block("flax-nnx", tmp_path, monkeypatch)
    nitro = module.nitro
    assert nitro.current_epoch == 3 and nitro.history[3]["acc"] > 0.85
    # The running statistics forward returned became the state, step after step.
    stats = nitro.train_state.model_state["norm"]
    assert np.abs(np.asarray(stats["mean"][...])).max() > 0.01
    assert not np.allclose(np.asarray(stats["var"][...]), 1.0)
    assert isinstance(nitro.data["train"].source, nx.ArraySource)


def test_the_equinox_example_runs_and_learns(tmp_path, monkeypatch):
    nitro = run_block("equinox", tmp_path, monkeypatch).nitro
    assert nitro.current_epoch == 3 and nitro.history[3]["acc"] > 0.85


def test_the_readme_names_step_rng_with_linen_and_nnx():
    text = README.read_text()
    assert 'rngs={"dropout": nx.step_rng()}' in text
    assert "nnx.Rngs(dropout=nx.step_rng())" in marked_block("flax-nnx")


def test_the_export_lines_follow_the_quick_start_and_serve_what_predict_gives(
    tmp_path, monkeypatch
):
    """The export block continues the quick start: on_epoch_end, export, load."""
    quick_start, export = python_blocks()[0], marked_block("export")
    (tmp_path / "readme_export.py").write_text(quick_start + "\n" + export)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    try:
        module = importlib.import_module("readme_export")  # trains twice, as a file
        served = module.served
        assert served.history[3]["err"] == pytest.approx(1 - served.history[3]["acc"])
        out = nx.load_bundle(module.path)(img=module.new_images)["logits"]
        np.testing.assert_allclose(
            out, served.predict({"img": module.new_images}), rtol=1e-5, atol=1e-5
        )
    finally:
        sys.modules.pop("readme_export", None)
