"""Checkpoint sources for `weights=` and `resume=`: which record a construction reads.

A source is a path to a record, or a `(run, which)` pair resolved through the run
directory's manifest: `run` is "latest" (the run that wrote last) or a run id, and
`which` is "best" or "latest". `resume="auto"` is `("latest", "latest")`, except that a
directory with nothing to resume starts a fresh run with a warning. A source that
cannot be found raises, naming the directory and the runs it holds: it never falls back
to fresh weights.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any

from ..errors import CheckpointError, ConfigError, NitroWarning, NotYetSupportedError
from .checkpointer import Best, Checkpointer, ManifestEntry, read_manifest


@dataclass(frozen=True)
class ResolvedSource:
    """A record a construction reads, and its manifest entry when it has one."""

    path: str
    entry: ManifestEntry | None
    is_run_newest: bool  # the newest record of its run: a resume continues that run


def _runs_held(run_dir: str) -> str:
    runs = sorted({str(e.run) for e in read_manifest(run_dir)})
    return ", ".join(runs) if runs else "none"


def _entry_for_path(path: str) -> tuple[ManifestEntry | None, bool]:
    directory, name = os.path.split(os.path.abspath(path))
    entries = read_manifest(directory)
    for entry in entries:
        if entry.file == name:
            newest = max(
                (e for e in entries if e.run == entry.run),
                key=lambda e: (e.epoch, e.written),
            )
            return entry, newest == entry
    return None, False


def resolve_source(
    source: Any, run_dir: str, checkpointer: Checkpointer | None, what: str
) -> ResolvedSource:
    """Resolve a path or `(run, which)` pair to a record in `run_dir`."""
    if isinstance(source, str | os.PathLike) and os.fspath(source) in (
        "best",
        "latest",
    ):
        raise ConfigError(
            f'{what}="{source}" is ambiguous about the run: use a pair such as '
            f'{what}=("latest", "{source}") for the newest run\'s {source} record.'
        )
    if isinstance(source, str | os.PathLike):
        path = os.fspath(source)
        if not os.path.isfile(path):
            raise CheckpointError(
                f"{what}={path!r}: no such checkpoint file. The run directory "
                f"{run_dir!r} holds the runs: {_runs_held(run_dir)}."
            )
        entry, is_newest = _entry_for_path(path)
        return ResolvedSource(path, entry, is_newest)
    if not (isinstance(source, tuple) and len(source) == 2):
        raise ConfigError(
            f"{what}= takes a checkpoint path or a (run, which) pair such as "
            f'("latest", "best"); got {source!r}.'
        )
    run, which = source
    if which not in ("best", "latest"):
        raise NotYetSupportedError(
            f'{what}=({run!r}, {which!r}): only "best" and "latest" are supported yet.'
        )
    if run == "all" and which == "latest":
        raise ConfigError(
            f'{what}=("all", "latest") is ("latest", "latest"): the newest record of '
            f"all is the newest run's newest record. Write that."
        )
    if not isinstance(run, str) or run in ("all", "legacy"):
        raise NotYetSupportedError(
            f'{what}=({run!r}, {which!r}): the run must be "latest" or a run id.'
        )
    entries = read_manifest(run_dir)
    if run == "latest":
        if not entries:
            raise CheckpointError(
                f"{what}=({run!r}, {which!r}): {run_dir!r} holds no checkpoints "
                f"(runs: none)."
            )
        run = max(entries, key=lambda e: (e.written, e.epoch)).run
    mine = [e for e in entries if e.run == run]
    if not mine:
        raise CheckpointError(
            f"{what}=({source[0]!r}, {which!r}): {run_dir!r} holds no run {run!r}. "
            f"Its runs: {_runs_held(run_dir)}."
        )
    newest = max(mine, key=lambda e: (e.epoch, e.written))
    if which == "latest":
        chosen = newest
    else:
        ranker = checkpointer if checkpointer is not None else Checkpointer()
        metric, mode = ranker.metric, ranker.mode
        if metric is None:
            scored = [e for e in mine if e.metric is not None]
            if not scored:
                raise CheckpointError(
                    f'{what}=({source[0]!r}, "best"): run {run!r} has no scored '
                    f"checkpoint (it ran without validation)."
                )
            metric, mode = scored[-1].metric, scored[-1].mode
        under = [
            e for e in mine if e.metric in (None, metric) and e.mode in (None, mode)
        ]
        if len(under) < len([e for e in mine if e.score is not None]):
            warnings.warn(
                f"Run {run!r} in {run_dir!r} holds checkpoints scored under another "
                f'metric or mode; "best" ranks only those under {metric}/{mode}.',
                NitroWarning,
                stacklevel=3,
            )
        probe = Checkpointer(keep=Best(1), metric=metric, mode=mode)
        picked = Best(1).select(under, probe)
        if not picked:
            raise CheckpointError(
                f'{what}=({source[0]!r}, "best"): run {run!r} has no checkpoint '
                f"scored under {metric}/{mode}."
            )
        chosen = picked[0]
    return ResolvedSource(os.path.join(run_dir, chosen.file), chosen, chosen == newest)


def resume_source(
    resume: Any, run_dir: str, checkpointer: Checkpointer | None
) -> ResolvedSource | None:
    """The record `resume=` names, or None for a fresh run."""
    if resume is False or resume is None:
        return None
    if resume == "auto":
        if not read_manifest(run_dir):
            warnings.warn(
                f'resume="auto" found nothing to resume in {run_dir!r}; starting a '
                f"fresh run.",
                NitroWarning,
                stacklevel=3,
            )
            return None
        return resolve_source(("latest", "latest"), run_dir, checkpointer, "resume")
    if resume is True:
        raise ConfigError(
            'resume=True is ambiguous: pass resume="auto", a checkpoint path, or a '
            '(run, which) pair such as ("latest", "latest").'
        )
    return resolve_source(resume, run_dir, checkpointer, "resume")
