"""What a run dir already holds of run files, and how `sexpgpu run` starts in it.

The engine's manifest lists a run dir's runs by id, not by the file that wrote
them, so a run file's run notes its file in `sexpgpu-runs.json` beside them: the
engine's run id -> the file's absolute path and the SHA-256 of its text. It is
written at the run's first block end, inside `train()`, so only a process that
holds the run dir's lock writes it (atomically: a temporary file, then a rename).

On start, `plan_start` reads both and says what the run dir holds: the earlier
runs of the same file (and whether the file changed since), and runs of other
files. With `--resume auto` it continues the latest run of the same file, like
the Python API's `resume="auto"` but never another file's run; a run dir whose
runs no file claims (written before files were noted) resumes its newest one.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any

from .source import counted

RUNS_FILE = "sexpgpu-runs.json"
"""The file, in a run dir, naming the run file of each run."""


def file_digest(path: str) -> str:
    """The SHA-256 of the file at `path`, in hex."""
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


class RunsFile:
    """`sexpgpu-runs.json` of a run dir: run id -> {"file", "sha256"}."""

    def __init__(self, run_dir: str) -> None:
        self.path = os.path.join(run_dir, RUNS_FILE)

    def read(self) -> dict[str, dict[str, str]]:
        """The runs noted so far ({} without a file, or with one not ours)."""
        try:
            with open(self.path, encoding="utf-8") as handle:
                found = json.load(handle)
            runs = found["runs"]
        except (OSError, ValueError, KeyError, TypeError):
            return {}
        if not isinstance(runs, dict):
            return {}
        return {
            str(run): entry
            for run, entry in runs.items()
            if isinstance(entry, dict) and isinstance(entry.get("file"), str)
        }

    def note(self, run: str, file: str, digest: str) -> None:
        """Note that the engine's run `run` is of `file` (text `digest`)."""
        runs = self.read()
        entry = {"file": os.path.abspath(file), "sha256": digest}
        if runs.get(run) == entry:
            return
        runs[run] = entry
        temporary = self.path + ".tmp"
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump({"format": 1, "runs": runs}, handle, indent=1)
        os.replace(temporary, self.path)


@dataclass(frozen=True)
class FileRun:
    """One engine run of a run dir: its id, latest checkpoint step and write
    time, and the run file noted for it (None: no file claims it)."""

    run: str
    step: int
    written: float
    file: str | None
    digest: str | None


def runs_in(run_dir: str) -> list[FileRun]:
    """The runs `run_dir`'s manifest lists, newest first, each with its file."""
    import jaxnitro as nx

    if not os.path.isdir(run_dir):
        return []
    latest: dict[str, Any] = {}
    for entry in nx.read_manifest(run_dir, warn=False):
        if entry.run is None:
            continue  # a manifest from before run ids: no run to resume by id
        kept = latest.get(entry.run)
        if kept is None or (entry.step, entry.written) > (kept.step, kept.written):
            latest[entry.run] = entry
    noted = RunsFile(run_dir).read()
    found = [
        FileRun(
            run,
            entry.step,
            entry.written,
            noted.get(run, {}).get("file"),
            noted.get(run, {}).get("sha256"),
        )
        for run, entry in latest.items()
    ]
    return sorted(found, key=lambda r: -r.written)


@dataclass(frozen=True)
class StartPlan:
    """How a run starts: the engine's `resume=` value (False for a new run) and
    the lines to print first."""

    resume: Any
    lines: tuple[str, ...]


def plan_start(path: str, run_dir: str, *, resume: bool) -> StartPlan:
    """What `run_dir` holds of the run file at `path`, and how a run of it starts.

    Example lines: `runs/minimal already holds 1 run of minimal.sx (its latest
    checkpoint at step 20); this run starts a new one from step 0: pass --resume
    auto to continue the latest`, `resuming run 3f2a... of minimal.sx at step 20
    (runs/minimal)`.
    """
    name = os.path.basename(path)
    mine_path = os.path.abspath(path)
    found = runs_in(run_dir)
    mine = [r for r in found if r.file == mine_path]
    others = sorted(
        {os.path.basename(r.file) for r in found if r.file and r.file != mine_path}
    )
    unclaimed = [r for r in found if r.file is None]
    lines: list[str] = []
    changed = ""
    if mine and mine[0].digest and mine[0].digest != file_digest(path):
        changed = f"; {name} has changed since"
    if others:
        lines.append(
            f"{run_dir} also holds runs of other files ({', '.join(others)}); "
            f"--resume auto never continues them"
        )
    if resume and mine:
        latest = mine[0]
        lines.append(
            f"resuming run {latest.run} of {name} at step {latest.step} "
            f"({run_dir}{changed})"
        )
        return StartPlan((latest.run, "latest"), tuple(lines))
    if resume and unclaimed:
        latest = unclaimed[0]
        lines.append(
            f"resuming run {latest.run} at step {latest.step} ({run_dir}): no "
            f"file is noted for it (a run from before sexpgpu noted its file)"
        )
        return StartPlan((latest.run, "latest"), tuple(lines))
    if resume:
        lines.append(
            f"--resume auto: {run_dir} holds no run of {name}; starting a new run"
        )
    elif mine:
        lines.append(
            f"{run_dir} already holds {counted(len(mine), 'run')} of {name} (the "
            f"latest checkpoint at step {mine[0].step}{changed}); this run starts a "
            "new one from step 0: pass --resume auto to continue the latest"
        )
    elif unclaimed:
        lines.append(
            f"{run_dir} already holds {counted(len(unclaimed), 'run')} no file is "
            "noted for; this run starts a new one from step 0: pass --resume auto "
            "to continue the latest"
        )
    return StartPlan(False, tuple(lines))
