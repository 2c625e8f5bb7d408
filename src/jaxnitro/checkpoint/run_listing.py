"""`runs`: the runs a run directory holds, one `RunSummary` each, from the manifest;
`run_directories`: the run directories a folder holds.

Each listed file's header (never its arrays) is read, so a summary names the files
that are missing, damaged, or hold another record than the one listed.

An id names the run in a checkpoint source (`weights=("<id>", "best")`), and
`checkpoint_run(nitro)` is a handle's own. The entries of a manifest written before
runs were recorded are one run, "legacy", listed last.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from typing import Any

from .integrity import MISSING, EntryProblem, entry_problem
from .lookup import Ranking, rank_best, run_label
from .manifest import RECORD_SUFFIX, ManifestEntry, manifest_path, read_manifest


@dataclass(frozen=True)
class RunSummary:
    """One run of a run directory, as `runs` reports it.

    Attributes:
        id: the run id, or "legacy" for a manifest written before runs were recorded.
        checkpoints: how many checkpoints the manifest keeps for it.
        epochs: theirs, ascending.
        metric, mode: the selection of its most recently written scored entry (None
            for a run with no score).
        best: the best score under that selection.
        metrics: every (metric, mode) pair its entries were scored under, with counts.
        written: the wall-clock time of its latest write (0.0 for legacy).
        parent: the checkpoint a branched run was resumed from.
        problems: its listed files that are missing, damaged or replaced by
            another record, by epoch (empty when every one is the record listed).
    """

    id: str
    checkpoints: int
    epochs: tuple[int, ...]
    metric: str | None
    mode: str | None
    best: float | None
    metrics: tuple[tuple[tuple[str, str], int], ...]
    written: float
    parent: str | None
    problems: tuple[EntryProblem, ...] = ()

    @property
    def missing(self) -> tuple[str, ...]:
        """The listed files that are gone."""
        return tuple(p.entry.file for p in self.problems if p.kind == MISSING)

    @property
    def damaged(self) -> tuple[str, ...]:
        """The listed files that cannot be read, or hold another record."""
        return tuple(p.entry.file for p in self.problems if p.kind != MISSING)


def _summary(
    run: str | None, entries: list[ManifestEntry], directory: str
) -> RunSummary:
    scored = [e for e in entries if e.score is not None and e.metric is not None]
    metric = mode = None
    best = None
    if scored:
        newest = max(scored, key=lambda e: (e.written, e.epoch))
        metric, mode = newest.metric, newest.mode
        picked = rank_best(entries, Ranking(metric, mode))
        best = picked[0].score if picked else None
    pairs = Counter((str(e.metric), str(e.mode)) for e in scored)
    parents = [e.parent for e in entries if e.parent]
    checked = (entry_problem(directory, e) for e in sorted(entries, key=_by_epoch))
    return RunSummary(
        id=run_label(run),
        checkpoints=len(entries),
        epochs=tuple(sorted(e.epoch for e in entries)),
        metric=metric,
        mode=mode,
        best=best,
        metrics=tuple(sorted(pairs.items())),
        written=max(e.written for e in entries),
        parent=parents[0] if parents else None,
        problems=tuple(p for p in checked if p is not None),
    )


def _by_epoch(entry: ManifestEntry) -> tuple[int, float]:
    return entry.epoch, entry.written


def runs(run_dir: str | os.PathLike[str]) -> list[RunSummary]:
    """The runs `run_dir`'s manifest holds, most recent first; "legacy" last.

    Answered from the manifest, and each listed file's header (no array is read),
    which marks the missing and damaged ones (`RunSummary.problems`). Empty for a
    directory no run has written to.
    """
    directory = os.fspath(run_dir)
    entries = read_manifest(directory)
    by_run: dict[str | None, list[ManifestEntry]] = {}
    for entry in entries:
        by_run.setdefault(entry.run, []).append(entry)
    summaries = [_summary(run, mine, directory) for run, mine in by_run.items()]
    return sorted(summaries, key=lambda s: (s.id == "legacy", -s.written))


def is_run_directory(directory: str) -> bool:
    """Whether `directory` holds a manifest or a checkpoint record."""
    if os.path.lexists(manifest_path(directory)):
        return True
    try:
        return any(name.endswith(RECORD_SUFFIX) for name in os.listdir(directory))
    except OSError:
        return False


def run_directories(directory: str | os.PathLike[str]) -> list[str]:
    """`directory` itself when it is a run directory (a manifest or a record in
    it), else the run directories directly inside it, by name: `runs/` of
    `runs/<Experiment>/` folders lists each. Empty when there are none."""
    root = os.fspath(directory)
    if is_run_directory(root):
        return [root]
    return sorted(
        path
        for name in os.listdir(root)
        if os.path.isdir(path := os.path.join(root, name)) and is_run_directory(path)
    )


def checkpoint_run(nitro: Any) -> str | None:
    """The id `nitro`'s checkpoints are written under (None with no checkpointer)."""
    return nitro.checkpoint_run
