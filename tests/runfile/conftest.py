"""Helpers: write a run file into the test's directory and evaluate or check it."""

from __future__ import annotations

from pathlib import Path

import pytest

MINIMAL = (
    Path(__file__).parents[2] / "examples" / "runfiles" / "minimal.sx"
).read_text()


@pytest.fixture
def write(tmp_path):
    def write(text: str, name: str = "run.sx") -> str:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return str(path)

    return write
