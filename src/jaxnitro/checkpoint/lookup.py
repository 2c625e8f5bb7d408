"""Manifest lookups: a run's latest or best checkpoint, read without opening a record.

`resolve_checkpoint` is the form that raises, naming the directory and the runs it
holds; `find_latest` and `selected_checkpoint` are the quiet forms that return None.
Runs are named by id, "latest" (the run of the entry written last; legacy entries,
written 0.0, count as oldest), "all" (every run, for "best" only) or "legacy" (the
unnamed run of a manifest written before runs were recorded).

A lookup checks the file it picked is the record the manifest lists (`integrity`):
a file another record was copied over is refused by name. `resume_latest`, what
`resume="auto"` reads, steps back past a newest record that is gone or damaged to
the newest readable one of the same run, with a warning naming it.
"""

from __future__ import annotations

import os
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..errors import CheckpointError, NitroWarning, user_stacklevel
from .integrity import MISSING, EntryProblem, check_listed, entry_problem
from .manifest import ManifestEntry, read_manifest
from .retention_checks import warn_mixed_metrics
from .selectors import Best

LEGACY = "legacy"


def run_label(run: str | None) -> str:
    """How messages and `runs` name a run: its id, or "legacy" for None."""
    return LEGACY if run is None else run


def runs_held(entries: Sequence[ManifestEntry]) -> str:
    """The runs `entries` hold, most recent first, with their checkpoint counts."""
    if not entries:
        return "none"
    counts = Counter(e.run for e in entries)
    newest = {run: max(e.written for e in entries if e.run == run) for run in counts}
    order = sorted(counts, key=lambda r: (r is None, -newest[r]))
    return ", ".join(f"{run_label(r)} ({counts[r]} checkpoints)" for r in order)


def latest_run(entries: Sequence[ManifestEntry]) -> str | None:
    """The run of the entry written last (legacy entries count as oldest)."""
    return max(entries, key=lambda e: (e.written, e.epoch)).run


def newest_of(entries: Sequence[ManifestEntry]) -> ManifestEntry:
    """The highest-epoch entry (the latest write among equals)."""
    return max(entries, key=lambda e: (e.epoch, e.written))


class Ranking(NamedTuple):
    """The metric and mode "best" ranks by; `metric`/`mode` like a checkpointer's."""

    metric: str | None
    mode: str | None


def ranking_for(
    checkpointer: Any,
    entries: Sequence[ManifestEntry],
    monitor: tuple[str, str] | None = None,
) -> Ranking | None:
    """The pair "best" ranks by: the checkpointer's, else `monitor`, else the pair
    the newest scored entry of `entries` was written under. None: nothing scored."""
    if checkpointer is not None and getattr(checkpointer, "metric", None) is not None:
        return Ranking(checkpointer.metric, checkpointer.mode)
    if monitor is not None:
        return Ranking(*monitor)
    scored = [e for e in entries if e.score is not None]
    if not scored:
        return None
    named = [e for e in scored if e.metric is not None]
    if not named:  # a manifest older than the metric field: lower was better
        return Ranking(None, "min")
    newest = max(named, key=lambda e: (e.written, e.epoch))
    return Ranking(newest.metric, newest.mode)


def rank_best(
    entries: Sequence[ManifestEntry], ranking: Ranking, k: int = 1
) -> list[ManifestEntry]:
    """The `k` best of `entries` under `ranking`; entries under another pair skipped."""
    return Best(k).select(entries, ranking)  # type: ignore[arg-type]


def source_directory(checkpointer: Any, run_dir: str) -> str:
    """The directory a lookup reads: the checkpointer's own `dir`, else `run_dir`.

    A checkpointer that follows the run directory (no `dir` given) reads `run_dir`,
    whatever directory an earlier setup bound it to.
    """
    if checkpointer is None:
        return os.fspath(run_dir)
    directory = getattr(checkpointer, "fixed_dir", getattr(checkpointer, "dir", None))
    return os.fspath(directory) if directory else os.fspath(run_dir)


def _of_run(entries: Sequence[ManifestEntry], run: Any) -> list[ManifestEntry]:
    wanted = None if run == LEGACY else run
    return [e for e in entries if e.run == wanted]


def _recent(entries: Sequence[ManifestEntry], run: Any) -> list[ManifestEntry]:
    if not entries:
        return []
    if run == "recent":
        run = latest_run(entries)
    return [e for e in entries if e.run == run]


def find_latest(checkpointer: Any, run_dir: str, *, run: Any = "recent") -> str | None:
    """The path of one run's highest-epoch retained record, or None.

    `run` is a run id, None for the unnamed run of a legacy manifest, or "recent"
    (the run that wrote the directory's most recent entry). None also when the file
    is gone.
    """
    directory = source_directory(checkpointer, run_dir)
    mine = _recent(read_manifest(directory), run)
    if not mine:
        return None
    newest = newest_of(mine)
    if entry_problem(directory, newest) is not None:
        return None
    return os.path.join(directory, newest.file)


@dataclass(frozen=True)
class SelectedCheckpoint:
    """A run's best checkpoint under the current metric and mode."""

    path: str
    epoch: int
    metric: str | None
    score: float | None
    run: str | None


def selected_checkpoint(
    checkpointer: Any, run_dir: str, *, run: Any = "recent"
) -> SelectedCheckpoint | None:
    """The best of one run's checkpoints by the checkpointer's metric and mode.

    The quiet form: None with no checkpointer, no scored entry under that pair, or a
    winning file that is gone, damaged or not the record listed; it never warns.
    `run` is as for `find_latest`.
    """
    if checkpointer is None:
        return None
    directory = source_directory(checkpointer, run_dir)
    mine = _recent(read_scored(directory, checkpointer), run)
    ranking = ranking_for(checkpointer, mine)
    if ranking is None:
        return None
    picked = rank_best(mine, ranking)
    if not picked:
        return None
    best = picked[0]
    if entry_problem(directory, best) is not None:
        return None
    path = os.path.join(directory, best.file)
    return SelectedCheckpoint(path, best.epoch, best.metric, best.score, best.run)


@dataclass(frozen=True)
class Found:
    """What `resolve_checkpoint` found: the entry, its directory, and whether it is
    the newest record of its run (a resume of it continues that run)."""

    entry: ManifestEntry
    directory: str
    is_run_newest: bool

    @property
    def path(self) -> str:
        return os.path.join(self.directory, self.entry.file)


def run_pool(
    entries: Sequence[ManifestEntry],
    directory: str,
    run: Any,
    which: Any,
    what: str,
) -> list[ManifestEntry]:
    """The entries of the run a source names; raises naming what the directory holds."""
    spelled = f"{what}=({run!r}, {which!r})"
    # A directory given as the run: the pair reads this handle's run_dir.
    hint = (
        f' The first element is a run id (or "latest") in this handle\'s run_dir '
        f"{directory!r}; to start from another directory pass run_dir={run!r}, or "
        f"a record's path."
        if isinstance(run, str) and (os.sep in run or os.path.isdir(run))
        else ""
    )
    if not entries:
        raise CheckpointError(
            f"{spelled}: {directory!r} holds no checkpoints (runs: none).{hint}"
        )
    if run == "all":
        return list(entries)
    if run == "latest":
        return _of_run(entries, latest_run(entries))
    mine = _of_run(entries, run)
    if not mine:
        raise CheckpointError(
            f"{spelled}: {directory!r} holds no run {run!r}. Its runs: "
            f"{runs_held(entries)}. See jaxnitro.runs({directory!r}).{hint}"
        )
    return mine


def resolve_checkpoint(
    checkpointer: Any,
    run_dir: str,
    run: Any,
    which: str,
    *,
    what: str,
    monitor: tuple[str, str] | None = None,
    entries: Sequence[ManifestEntry] | None = None,
) -> Found:
    """Resolve `(run, which)` to a record through the manifest, or raise.

    `which` is "latest" (the run's newest retained record) or "best" (the best by the
    checkpointer's current metric and mode, else `monitor`, else the pair the newest
    scored entry was written under; across every run for run "all"). The file must
    be the record listed: one gone, damaged or replaced by another record raises,
    naming it. A "best" over
    entries scored under another pair warns that they were not ranked, and a run
    with none under the current pair raises, naming those it has. `entries`: the
    directory's manifest when the caller has read it already.
    """
    directory = source_directory(checkpointer, run_dir)
    if entries is None:
        entries = read_scored(directory, checkpointer, monitor)
    pool = run_pool(entries, directory, run, which, what)
    spelled = f"{what}=({run!r}, {which!r})"
    if which == "latest":
        chosen = newest_of(pool)
    else:
        ranking = ranking_for(checkpointer, pool, monitor)
        if ranking is None:
            raise CheckpointError(
                f"{spelled}: {_whose(run, pool)} no scored checkpoint (it ran without "
                f'validation); use ({run!r}, "latest").'
            )
        warn_mixed_metrics(pool, ranking, f"{spelled} in {directory!r}")
        picked = rank_best(pool, ranking)
        if not picked:
            pairs = sorted(
                {f"{e.metric}/{e.mode}" for e in pool if e.score is not None}
            )
            raise CheckpointError(
                f"{spelled}: {_whose(run, pool)} no checkpoint scored under "
                f"{ranking.metric}/{ranking.mode}; it has {', '.join(pairs)}. Pass "
                f"Checkpointer(metric=..., mode=...) for one of those."
            )
        chosen = picked[0]
    problem = check_listed(directory, chosen)  # a record copied over it: refused
    if problem is not None and problem.kind == MISSING:
        raise CheckpointError(
            f"{spelled}: the manifest of {directory!r} lists {chosen.file}, but the "
            f"file is gone. Restore it, or name another checkpoint."
        )
    if problem is not None:
        raise CheckpointError(
            f"{spelled}: the manifest of {directory!r} lists {chosen.file}, but the "
            f"file is damaged: {problem.detail} Restore it, or name another "
            f"checkpoint."
        )
    newest = newest_of([e for e in entries if e.run == chosen.run])
    return Found(chosen, directory, chosen == newest)


def _whose(run: Any, pool: Sequence[ManifestEntry]) -> str:
    if run == "all":
        return "the directory holds"
    label = run_label(pool[0].run) if pool else str(run)
    return f"run {label!r} has"


def read_scored(
    directory: str, checkpointer: Any, monitor: tuple[str, str] | None = None
) -> list[ManifestEntry]:
    """`read_manifest(directory)`; a lost manifest's rebuilt entries are scored by
    the checkpointer's metric and mode, else `monitor`, from the metrics their
    headers hold (unscored when neither is known)."""
    metric = getattr(checkpointer, "metric", None)
    if metric is not None:
        return read_manifest(directory, metric=metric, mode=checkpointer.mode)
    if monitor is not None:
        return read_manifest(directory, metric=monitor[0], mode=monitor[1])
    return read_manifest(directory)


FELL_BACK = (
    'resume="auto": the newest record of run {run} in {directory!r} cannot be '
    "resumed: {problems}. Continuing the run from the newest readable one, epoch "
    "{epoch} ({path}); the epochs after it are trained again."
)


def resume_latest(
    checkpointer: Any,
    run_dir: str,
    *,
    monitor: tuple[str, str] | None = None,
    entries: Sequence[ManifestEntry] | None = None,
) -> Found:
    """What `resume="auto"` continues: the newest record of the directory's latest
    run, or, when that file is gone or damaged, the newest readable record of the
    same run, with a NitroWarning naming the ones passed over (as Orbax falls back
    to the previous step). The record found continues its run.

    Raises:
        CheckpointError: the directory holds no checkpoint; a file holds another
            record than the one listed (its lineage is another run's); no record
            of the run is readable (each is named with why).
    """
    directory = source_directory(checkpointer, run_dir)
    if entries is None:
        entries = read_scored(directory, checkpointer, monitor)
    pool = run_pool(entries, directory, "latest", "latest", "resume")
    passed: list[EntryProblem] = []
    for entry in sorted(pool, key=lambda e: (e.epoch, e.written), reverse=True):
        problem = check_listed(directory, entry)
        if problem is None:
            if passed:
                warnings.warn(
                    FELL_BACK.format(
                        run=run_label(entry.run),
                        directory=directory,
                        problems="; ".join(_problem_line(p) for p in passed),
                        epoch=entry.epoch,
                        path=os.path.join(directory, entry.file),
                    ),
                    NitroWarning,
                    stacklevel=user_stacklevel(),
                )
            return Found(entry, directory, is_run_newest=True)
        passed.append(problem)
    raise CheckpointError(
        f'resume="auto": no record of run {run_label(pool[0].run)} in {directory!r} '
        f"is readable: {'; '.join(_problem_line(p) for p in passed)}. Restore one, "
        f"or start a fresh run (resume=False)."
    )


def _problem_line(problem: EntryProblem) -> str:
    """`epoch-0003-....safetensors (epoch 3) is missing` / `... is damaged (why)`."""
    name = f"{problem.entry.file} (epoch {problem.entry.epoch})"
    if problem.kind == MISSING:
        return f"{name} is missing"
    return f"{name} is damaged ({problem.detail})"
