"""A server root holding the agent test experiments, and waiting on background runs."""

from __future__ import annotations

import shutil
from pathlib import Path

AGENT_FILE = Path(__file__).parent / "agent_files" / "tiny_agent.py"


def make_root(tmp_path: Path) -> Path:
    """A folder `root/` under `tmp_path` holding `tiny_agent.py`."""
    root = tmp_path / "root"
    root.mkdir()
    shutil.copy(AGENT_FILE, root / "tiny_agent.py")
    return root


def finish(tools, run_id: str, timeout: float = 120.0) -> dict:
    """Wait for a background run to end and return its status."""
    run = tools.registry.get(run_id)
    run.join(timeout)
    assert not run.active, f"run {run_id} still {run.state} after {timeout} s"
    return tools.status(run_id)
