"""Every ```python block of the documentation site runs, so no example rots.

The blocks of one page run in order in one namespace, in a fresh working directory
(a page writes its run directories there). A block that cannot run in CI is marked
on the line before it with `<!-- no-run: the reason -->`; the reason is required.
"""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest

import jaxnitro

DOCS = Path(__file__).resolve().parents[2] / "docs"
BLOCK = re.compile(r"^```python[^\n]*\n(.*?)^```[ \t]*$", flags=re.S | re.M)
NO_RUN = re.compile(r"<!--\s*no-run:(.*?)-->\s*$")


def pages() -> list[Path]:
    """Every page of the site that holds a ```python block."""
    return sorted(p for p in DOCS.rglob("*.md") if BLOCK.search(p.read_text()))


def blocks(page: Path) -> list[tuple[int, str, str | None]]:
    """(line, code, no-run reason or None) of each ```python block of page."""
    text = page.read_text()
    found = []
    for match in BLOCK.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marked = NO_RUN.search(before)
        found.append(
            (line, match.group(1), marked.group(1).strip() if marked else None)
        )
    return found


def test_the_pages_hold_python_blocks_and_few_are_skipped():
    every = [b for page in pages() for b in blocks(page)]
    skipped = [b for b in every if b[2] is not None]
    assert len(every) >= 10
    assert len(skipped) * 4 <= len(every), "keep no-run blocks rare"


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(DOCS)))
def test_the_page_runs(page, tmp_path, monkeypatch):
    """The page's runnable blocks, as one module whose lines are the page's lines
    (blank elsewhere), so a traceback names the line of the page."""
    lines = [""] * page.read_text().count("\n")
    runnable = 0
    for line, code, reason in blocks(page):
        if reason is not None:
            assert reason, f"{page.name}:{line}: a no-run block needs its reason"
            compile(code, f"{page.name}:{line}", "exec")  # still valid Python
            continue
        for i, text in enumerate(code.splitlines()):
            lines[line + i] = text
        runnable += 1
    assert runnable, f"{page.name}: every python block is no-run"
    name = "docs_page_" + re.sub(r"\W", "_", str(page.relative_to(DOCS))[:-3])
    (tmp_path / f"{name}.py").write_text("\n".join(lines) + "\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("NITRO_SMOKE", raising=False)
    try:
        importlib.import_module(name)  # runs the blocks, in order
    finally:
        sys.modules.pop(name, None)
        jaxnitro.progress_reporter(jaxnitro.observe.default_progress_reporter)
