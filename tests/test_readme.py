"""The README's Python blocks run as written: copied into a file, they train."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import numpy as np

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
