"""Checkpoint sources for `weights=` and `resume=`: which record a construction reads.

A source is a path to a record, a `Nitro` (weights only: the in-memory warm start),
or a `(run, which)` pair resolved through the run directory's manifest:

* run: "latest" (the run that wrote last), "all" (every run; with "best" only), a run
  id, "legacy" (a manifest written before runs were recorded), or a Nitro (that
  handle's own run, in its own directory, through its own checkpointer);
* which: "best", "latest" (`Best(1)` and `Last(1)` are the same), "current" (a
  Nitro's in-memory state; weights only), or `Average(selector)` (weights and
  `restore_best` only). Any other selector is taken only inside `Average`.

`resume="auto"` is `("latest", "latest")`, except that a directory with nothing to
resume starts a fresh run with a warning, and a newest record that is gone or
damaged is stepped back past, with a warning, to the newest readable one of the same
run (`lookup.resume_latest`). A source that cannot be found raises,
naming the directory and the runs it holds: it never falls back to fresh weights.
"""

from __future__ import annotations

import logging
import os
import warnings
from dataclasses import dataclass
from typing import Any

from ..errors import CheckpointError, ConfigError, NitroWarning, NotYetSupportedError
from .averaging import Average, average_records, expected_count, keep_for
from .checkpointer import Checkpointer
from .integrity import entry_problem
from .lookup import (
    newest_of,
    rank_best,
    ranking_for,
    read_scored,
    resolve_checkpoint,
    resume_latest,
    run_label,
    run_pool,
    runs_held,
    source_directory,
)
from .manifest import ManifestEntry, load_manifest, read_manifest
from .record import CheckpointRecord, write_arrays
from .retention_checks import warn_mixed_metrics
from .selectors import Last
from .source_checks import check_source, is_nitro, normalize_which

log = logging.getLogger("jaxnitro")

SHORT_AVERAGE = """\
{source}: {selector!r} names {wanted} checkpoints, but run {run!r} in {directory!r} \
holds {count} of them (epochs {picked}; the run holds epochs {held}). The run must \
still hold every checkpoint the selector names: keep them while training with \
Checkpointer(keep=(Best(3), {keep!r})), or average fewer."""


@dataclass(frozen=True)
class ResolvedSource:
    """A record file a source resolved to, and its manifest entry when it has one."""

    path: str
    entry: ManifestEntry | None
    is_run_newest: bool  # the newest record of its run: a resume continues that run

    def load(self) -> CheckpointRecord:
        """Open the record."""
        return CheckpointRecord(self.path)


@dataclass(frozen=True)
class AverageSource:
    """`(run, Average(sel))` resolved: the entries to average, from one run.

    `load()` averages them into an in-memory record whose header has
    `averaged_from`; `state_entry` is the pick the model state comes from.
    """

    average: Average
    picks: tuple[ManifestEntry, ...]
    directory: str
    state_entry: ManifestEntry
    run: str | None

    def load(self) -> CheckpointRecord:
        """Average the picked records into one in-memory record."""
        return average_records(
            self.picks,
            self.directory,
            self.average,
            self.state_entry,
            run_label=run_label(self.run),
        )


@dataclass(frozen=True)
class HandleSource:
    """A live `Nitro` whose in-memory parameters a construction takes (weights only)."""

    handle: Any


WeightsSource = ResolvedSource | AverageSource | HandleSource


def _entry_for_path(path: str) -> tuple[ManifestEntry | None, bool]:
    directory, name = os.path.split(os.path.abspath(path))
    try:
        entries = load_manifest(directory).entries  # a path needs no manifest
    except CheckpointError:
        return None, False  # a damaged manifest beside it does not block a path
    for entry in entries:
        if entry.file == name:
            if entry_problem(directory, entry) is not None:
                return None, False  # not the record listed: a branch, not its run
            newest = newest_of([e for e in entries if e.run == entry.run])
            return entry, newest == entry
    return None, False


def resolve_weights_source(
    source: Any,
    run_dir: str,
    checkpointer: Checkpointer | None,
    what: str = "weights",
    *,
    monitor: tuple[str, str] | None = None,
    restore_optimizer: bool = False,
    allow_short: bool = False,
) -> WeightsSource:
    """Resolve any weights source: a record file, an average, or a live handle.

    `checkpointer` is this run's (its `dir`, else `run_dir`, is read; its current
    metric and mode, else `monitor`, decide "best"). A `(Nitro, which)` pair reads
    that handle's own run in its own directory through its own checkpointer. An
    `Average` whose selector names more checkpoints than the run holds is refused,
    unless `allow_short` (restore_best, which warns about it itself).
    """
    check_source(source, what, restore_optimizer=restore_optimizer)
    if isinstance(source, str | os.PathLike):
        path = os.fspath(source)
        if not os.path.isfile(path):
            directory = source_directory(checkpointer, run_dir)
            hint = (
                ' To continue the newest run in run_dir, pass resume="auto".'
                if what == "resume"
                else ""
            )
            raise CheckpointError(
                f"{what}={path!r}: no such checkpoint file. The run directory "
                f"{directory!r} holds the runs: {_held(directory)}. A path names a "
                f'record file; (run_id, "latest" or "best") names one of a '
                f"run's checkpoints.{hint}"
            )
        entry, is_newest = _entry_for_path(path)
        return ResolvedSource(path, entry, is_newest)
    if is_nitro(source):
        return HandleSource(source)
    run, which = source[0], normalize_which(source[1])
    if which == "current":
        return HandleSource(run)
    if is_nitro(run):
        other = run
        if other.checkpointer is None:
            raise CheckpointError(
                f"{what}=(<Nitro>, {which!r}): that handle has no checkpointer, so it "
                f'wrote no checkpoints; use (other, "current") for its in-memory '
                f"weights."
            )
        checkpointer, run_dir = other.checkpointer, other.run_dir
        run = run_label(other.checkpoint_run)
    if isinstance(which, Average):
        return _resolve_average(
            run, which, run_dir, checkpointer, what, monitor, allow_short
        )
    found = resolve_checkpoint(
        checkpointer, run_dir, run, which, what=what, monitor=monitor
    )
    return ResolvedSource(found.path, found.entry, found.is_run_newest)


def resolve_source(
    source: Any,
    run_dir: str,
    checkpointer: Checkpointer | None,
    what: str,
    *,
    monitor: tuple[str, str] | None = None,
    restore_optimizer: bool = False,
) -> ResolvedSource:
    """Resolve a source that must be one record file: a path or `(run, which)`.

    A path is itself; `(run, "latest" | "best")` is resolved through the manifest
    of the checkpointer's directory (its `dir`, else `run_dir`) by
    `resolve_checkpoint`. It raises rather than fall back to fresh weights when the
    record cannot be found. An `Average` or a live handle is refused here
    (`resolve_weights_source` takes them): resume always reads one record.

    Args:
        source: a source `check_source` accepts.
        run_dir: the run directory read when the checkpointer has no `dir`.
        checkpointer: the run's checkpointer (its metric and mode decide "best"),
            or None.
        what: how the caller names the source in messages ("weights", "resume").
        monitor: the `(metric, mode)` "best" ranks by when the checkpointer has
            none.
        restore_optimizer: whether the optimizer state is restored too.

    Returns:
        ResolvedSource: `.path`, `.entry` (its manifest entry, when listed) and
        `.is_run_newest` (whether a resume of it continues its run); `.load()`
        reads the record.

    Raises:
        CheckpointError: no such file, or no record the pair names (the message
            lists what the directory holds).
        NotYetSupportedError: an average or a live handle.
    """
    resolved = resolve_weights_source(
        source,
        run_dir,
        checkpointer,
        what,
        monitor=monitor,
        restore_optimizer=restore_optimizer,
    )
    if not isinstance(resolved, ResolvedSource):
        raise NotYetSupportedError(
            f"{what}={source!r} is not one checkpoint record; this caller reads only "
            f'a record (a path or a (run, "best" | "latest") pair).'
        )
    return resolved


def _held(directory: str) -> str:
    try:
        return runs_held(read_manifest(directory))
    except CheckpointError as error:
        return f"unknown ({error})"


def _resolve_average(
    run: Any,
    average: Average,
    run_dir: str,
    checkpointer: Checkpointer | None,
    what: str,
    monitor: tuple[str, str] | None,
    allow_short: bool,
) -> AverageSource:
    directory = source_directory(checkpointer, run_dir)
    entries = read_scored(directory, checkpointer, monitor)
    pool = run_pool(entries, directory, run, average, what)
    ranking = ranking_for(checkpointer, pool, monitor)
    ranker = ranking if ranking is not None else Checkpointer(keep=Last(1))
    if getattr(average.selector, "ranks", False):
        if ranking is None:
            raise CheckpointError(
                f"{what}=({run!r}, {average!r}): the run has no scored checkpoint to "
                f"rank; average Last(n) instead."
            )
        warn_mixed_metrics(pool, ranking, f"{what}=({run!r}, {average!r})")
    picks = sorted(
        average.selector.select(pool, ranker), key=lambda e: (e.epoch, e.written)
    )
    if not picks:
        raise CheckpointError(
            f"{what}=({run!r}, {average!r}): the selector picks no checkpoint of run "
            f"{run_label(pool[0].run)!r} in {directory!r}, which holds epochs "
            f"{sorted(e.epoch for e in pool)}."
        )
    wanted = expected_count(average.selector)
    if not allow_short and wanted is not None and len(picks) < wanted:
        # Averaging the fewer held would be a different average than the one named.
        raise CheckpointError(
            SHORT_AVERAGE.format(
                source=f"{what}=({run!r}, {average!r})",
                selector=average.selector,
                wanted=wanted,
                run=run_label(pool[0].run),
                directory=directory,
                count=len(picks),
                picked=[e.epoch for e in picks],
                held=sorted(e.epoch for e in pool),
                keep=keep_for(average.selector),
            )
        )
    missing = [
        e.file for e in picks if not os.path.isfile(os.path.join(directory, e.file))
    ]
    if missing:
        raise CheckpointError(
            f"{what}=({run!r}, {average!r}): {directory!r} no longer holds "
            f"{', '.join(missing)}. The run must still hold every checkpoint the "
            f"selector names; keep them while training with Checkpointer(keep=...)."
        )
    if average.state_from == "best":
        best = [] if ranking is None else rank_best(picks, ranking)
        if not best:
            raise CheckpointError(
                f'{what}=({run!r}, {average!r}): state="best" needs a scored '
                f'checkpoint among the picks; pass state="latest".'
            )
        state_entry = best[0]
    else:
        state_entry = newest_of(picks)
    return AverageSource(average, tuple(picks), directory, state_entry, picks[0].run)


def resume_source(
    resume: Any,
    run_dir: str,
    checkpointer: Checkpointer | None,
    *,
    monitor: tuple[str, str] | None = None,
) -> ResolvedSource | None:
    """The record `resume=` names, or None for a fresh run."""
    if resume is False or resume is None:
        return None
    if resume is True:
        raise ConfigError(
            'resume=True is ambiguous: pass resume="auto", a checkpoint path, or a '
            '(run, which) pair such as ("latest", "latest").'
        )
    if isinstance(resume, str) and resume == "auto":
        directory = source_directory(checkpointer, run_dir)
        entries = read_scored(directory, checkpointer, monitor)
        if not entries:
            warnings.warn(
                f'resume="auto" found nothing to resume in {directory!r}; starting a '
                f"fresh run.",
                NitroWarning,
                stacklevel=3,
            )
            return None
        # ("latest", "latest") from the entries just read, stepping back past a
        # newest record that is gone or damaged.
        found = resume_latest(checkpointer, run_dir, monitor=monitor, entries=entries)
        log.info(
            'resume="auto": continuing run %s from epoch %d (%s)',
            run_label(found.entry.run),
            found.entry.epoch,
            found.path,
        )
        return ResolvedSource(found.path, found.entry, found.is_run_newest)
    return resolve_source(resume, run_dir, checkpointer, "resume", monitor=monitor)


def average_checkpoints(
    run_dir: str | os.PathLike[str],
    source: tuple[Any, Average],
    *,
    checkpointer: Checkpointer | None = None,
    save: str | os.PathLike[str] | None = None,
) -> CheckpointRecord:
    """The averaged record `weights=(run, Average(sel))` would load, on the host.

    With `save`, also written there as an ordinary record (`weights=save` loads it;
    `checkpoint_info` shows its `averaged_from`). It is not added to the manifest, so
    retention never ranks or deletes it; an existing file is refused.

    Example (not run):
        average_checkpoints("runs/Exp", ("latest", Average(Last(10))),
                            save="runs/Exp/avg-last10.safetensors")
    """
    if not (isinstance(source, tuple) and len(source) == 2) or not isinstance(
        source[1], Average
    ):
        raise ConfigError(
            f"average_checkpoints takes a (run, Average(selector)) pair such as "
            f'("latest", Average(Last(10))); got {source!r}.'
        )
    target = None if save is None else os.fspath(save)
    if target is not None and os.path.exists(target):
        raise CheckpointError(
            f"average_checkpoints(save={target!r}): the file exists; it refuses to "
            f"overwrite one. Choose another path or delete it first."
        )
    resolved = resolve_weights_source(
        source, os.fspath(run_dir), checkpointer, "average_checkpoints"
    )
    assert isinstance(resolved, AverageSource)  # check_source refused the rest
    record = resolved.load()
    if target is None:
        return record
    write_arrays(target, record.arrays, record.header)
    return CheckpointRecord.in_memory(record.arrays, record.header, target)
