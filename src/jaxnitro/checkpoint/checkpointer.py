"""`Checkpointer`: after each epoch, write a record if a selector keeps it; rotate.

After each epoch the checkpointer writes a record if some selector in `keep` admits
it, then keeps the union of what the selectors pick and deletes the rest. The
manifest (`manifest.py`) lists every retained file with its epoch, score,
stop_reason and the run, metric and mode that wrote it, so lookups and resume never
open a record.

Retention scope. Under scope "run" (the default) retention decides over this run's
entries only: another run's files are never ranked, rotated, deleted or overwritten.
Under scope "dir", `Best` ranks every run's entries and a write deletes every entry
scored the same way that no selector keeps, other runs' included; `Last` and the
other selectors still keep this run's own. Under either scope an entry scored under
another metric or mode is never ranked or deleted, and a filename that would
overwrite a file this run does not own gets `-run-<id>` before the extension.

Order of a write: the record goes to a temporary file renamed into place, then the
manifest is replaced atomically, and only then are rotated files deleted, so a crash
at any instant leaves a readable directory whose manifest names complete records. A
fresh directory gets an empty manifest before its first record, so records without
a manifest always mean a lost one (which lookups rebuild, and the first save writes
back), never a kill between the first record and its manifest.

The parts a write uses live beside it: `naming` (the name function's answer checked,
a free variant of it), `retention` (what the selectors keep, what rotation deletes)
and `recovery` (finishing what a killed write left); `load_checkpoint` is in
`loading`.
"""

from __future__ import annotations

import dataclasses
import os
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from ..devices.distributed import is_rank0
from ..devices.gather import gather_split_leaves
from ..errors import CheckpointError, ConfigError
from ..watch import is_unscored, read_watched
from .header import RecordHeader
from .manifest import (
    Manifest,
    ManifestEntry,
    holds_records,
    load_manifest,
    manifest_path,
    read_manifest,
    remove_file,
    write_manifest,
)
from .naming import check_name_function, free_filename, name_function, record_filename
from .paths import checked_path
from .record import (
    TMP_PREFIX,
    CheckpointRecord,
    read_header_checksummed,
    rewrite_header,
    save_record,
)
from .recovery import recover_directory
from .retention import kept_entries, others_ranked, rotation
from .selectors import Best, Last, is_scored_under, is_selector

SCOPES = ("run", "dir")
STOP_REASONS = ("completed", "early_stop", "requested", "preempted", "error")
DEFAULT_KEEP = (Best(3), Last(1))


class Checkpointer:
    """Writes a record after each epoch that some selector in `keep` retains.

    A `Nitro` binds it at setup (`bind`: the run directory, the monitor, the run
    id) and calls `save` after each epoch's validation: the record is written only
    if some selector admits the epoch, then the union of what the selectors pick
    is kept and this run's other entries are deleted (under scope "dir", other
    runs' entries that `Best` ranks too; an entry scored under another metric or
    mode is never ranked or deleted). When `train()` ends, `finalize` writes how
    it ended into the last record, if that epoch was kept.

    Without a `Last`, an epoch no selector admits is never written, so the state
    training ended in is saved only if a selector keeps the last epoch; setup
    warns about this for a handle that trains, and refuses a keep of only `Best`
    selectors for a training run with no val split, whose epochs have no score.
    Pass `checkpointer=None` to `Nitro` to write no checkpoints.

    An epoch whose metric is NaN or infinite, or whose validation pass's forward
    outputs held NaN or infinite values while the metric stayed finite (accuracy
    over NaN logits; the metrics then carry `nonfinite_outputs`, the count),
    is unscored, as an epoch without validation is: evaluation warns of it, no
    `Best` ever ranks it, and a `Last` may keep its record, listed with no score.
    Ranking it worst instead would let a `Best(k)` with fewer than k scored epochs
    keep a diverged model as "best".

    Args:
        keep: a selector or a tuple of them; the union of what they pick is kept.
            The default, `(Best(3), Last(1))`, keeps the best 3 by the metric
            (lower is better under mode "min", higher under "max") plus the
            latest, whatever it scored. A selector is a `Selector` or any object
            with a `select(entries, checkpointer)` method.
        metric: the validation metric to rank by, a key of what validation
            returns; give it with `mode`, or neither to follow the run's `monitor`.
        mode: "min" or "max": which way `metric` is better.
        dir: the directory; None is filled with the run directory at setup.
        name: the filename function `name(epoch=, step=, metric=, score=) -> str`,
            returning a bare filename (the record suffix is appended when it is
            missing); None is filled at setup with the experiment's
            `checkpoint_filename` hook (by default `jaxnitro.checkpoint_filename`),
            looked up at every write, so a redefined hook names the next record.
        scope: "run" (default) applies retention to this run's files only; "dir"
            lets Best rank, and rotation delete, every run's files (see the module).

    Attributes:
        keep (tuple): the selectors, as a tuple.
        metric (str | None): the metric ranked by, once bound; None ranks nothing.
        mode (str | None): "min" or "max", once bound.
        dir (str | None): the directory it reads and writes.
        scope (str): "run" or "dir".
        run (str | None): the id of the run it writes for, set by `bind`.
        parent (str | None): for a run branched from an earlier record, that
            record's path.

    Raises:
        ConfigError: `keep` is empty or holds something that is not a selector; a
            `Best` with `among` (that is for loading); a `mode` other than "min" or
            "max"; `metric` without `mode`, or the reverse; a `scope` other than
            "run" or "dir"; a `name` that is not callable.

    Examples:
        >>> Checkpointer(keep=(Best(3), Last(10)))  # the best 3 and the latest 10
        Checkpointer(keep=(Best(k=3, among=None), Last(n=10)), metric=None, mode=None)
        >>> Checkpointer(keep=Last(5)).keep  # a rolling window
        (Last(n=5),)
        >>> Checkpointer(metric="acc")
        Traceback (most recent call last):
        ...
        jaxnitro.errors.ConfigError: Checkpointer(metric='acc', mode=None): give ...
    """

    def __init__(
        self,
        keep: Any = DEFAULT_KEEP,
        metric: str | None = None,
        mode: str | None = None,
        dir: str | os.PathLike[str] | None = None,
        name: Callable[..., str] | None = None,
        scope: str = "run",
    ) -> None:
        selectors = (keep,) if is_selector(keep) else tuple(keep)
        if not selectors or not all(is_selector(s) for s in selectors):
            raise ConfigError(
                f"Checkpointer(keep=...) takes selectors such as Best(3) and Last(1), "
                f"or objects with a select(entries, checkpointer) method; got "
                f"{keep!r}."
            )
        for selector in selectors:
            if isinstance(selector, Best) and selector.among is not None:
                raise ConfigError(
                    "Best(among=...) is for loading (as in Average); keep refuses it. "
                    "Keep the pool itself instead, e.g. keep=(Best(5), Last(20))."
                )
        if mode is not None and mode not in ("min", "max"):
            raise ConfigError(
                f'Checkpointer mode must be "min" or "max", got {mode!r}.'
            )
        if (metric is None) != (mode is None):
            raise ConfigError(
                f"Checkpointer(metric={metric!r}, mode={mode!r}): give both to rank "
                f'by something other than the monitor (e.g. metric="acc", '
                f'mode="max"), or neither to follow the run\'s monitor.'
            )
        if scope not in SCOPES:
            raise ConfigError(
                f'Checkpointer scope must be "run" (retention over this run\'s files) '
                f'or "dir" (over the whole directory), got {scope!r}.'
            )
        if name is not None and not callable(name):
            raise ConfigError(
                f"Checkpointer(name=...) takes a filename function "
                f"name(epoch=, step=, metric=, score=) -> str, got {name!r}."
            )
        self.keep = selectors
        self.metric = metric
        self.mode = mode
        self.dir = None if dir is None else os.fspath(dir)
        self.name = name
        self.scope = scope
        self.run: str | None = None
        self.parent: str | None = None
        self._follows_monitor = metric is None
        self._follows_run_dir = dir is None
        # Filled by `bind` with the experiment's hook while `name` is None.
        self._bound_name: Callable[..., str] | None = None
        self._last_saved: ManifestEntry | None = None
        self._recovered = False

    def __repr__(self) -> str:
        return (
            f"Checkpointer(keep={self.keep!r}, metric={self.metric!r}, "
            f"mode={self.mode!r})"
        )

    @property
    def fixed_dir(self) -> str | None:
        """The directory given at construction; None when it follows run_dir."""
        return None if self._follows_run_dir else self.dir

    @property
    def ranks(self) -> bool:
        """Whether some selector ranks by score (needs a metric)."""
        return any(getattr(s, "ranks", False) for s in self.keep)

    @property
    def only_ranks(self) -> bool:
        """Whether every selector ranks by score (an unscored epoch is never kept)."""
        return all(getattr(s, "ranks", False) for s in self.keep)

    @property
    def has_last(self) -> bool:
        """Whether keep holds a `Last`, so every epoch is written."""
        return any(isinstance(s, Last) for s in self.keep)

    @property
    def k(self) -> int:
        """Deprecated (TopKCheckpointer): the largest Best's k, else 0."""
        warnings.warn(
            "Checkpointer.k is deprecated: read the Best selectors in "
            "checkpointer.keep instead.",
            DeprecationWarning,
            stacklevel=2,
        )
        return max((s.k for s in self.keep if isinstance(s, Best)), default=0)

    @property
    def keep_latest(self) -> bool:
        """Deprecated (TopKCheckpointer): whether keep has a Last."""
        warnings.warn(
            "Checkpointer.keep_latest is deprecated: use checkpointer.has_last.",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.has_last

    def bind(
        self,
        *,
        directory: str,
        monitor: tuple[str, str] | None,
        run: str | None,
        parent: str | None,
        filename: Callable[..., str] | None = None,
    ) -> None:
        """Fill in what setup resolves: the directory, the metric and the run id.

        A `Nitro` calls it at setup; a later `bind` (another handle reusing this
        checkpointer) rebinds it and forgets the previous run's last save.

        Args:
            directory: the run directory; used unless `dir` was given.
            monitor: the run's `(metric, mode)`, or None; used unless `metric` and
                `mode` were given.
            run: the id of the run the records are written for (None: the
                unnamed run of a manifest from before run ids).
            parent: for a run branched from an earlier record, that record's path.
            filename: the experiment's filename hook, called as `name` is; used
                unless `name` was given. None keeps `checkpoint_filename`.
        """
        self._bound_name = filename
        if self._follows_run_dir:
            self.dir = os.fspath(directory)
        if self._follows_monitor:
            self.metric, self.mode = monitor if monitor is not None else (None, None)
        self.run = run
        self.parent = parent
        self._last_saved = None
        self._recovered = False
        check_name_function(*self._naming(), metric=self.metric)

    def entries(self) -> list[ManifestEntry]:
        """Every entry of the directory's manifest, every run's.

        Returns:
            list[ManifestEntry]: the retained checkpoints, as the manifest lists
            them; empty for a directory no run has written to.

        Raises:
            CheckpointError: no directory yet (neither `dir` nor a `bind`), or the
                manifest cannot be read.
        """
        # A lost manifest's rebuilt entries are scored as this checkpointer ranks.
        return read_manifest(self._directory(), metric=self.metric, mode=self.mode)

    def load(self, path: str | os.PathLike[str]) -> CheckpointRecord:
        """Read the record at `path`: its header (checked first) and its arrays.

        A record of another format version, or a header that is damaged or not a
        jaxnitro record, raises `CheckpointError` naming the file; keys a record
        of this format written before they existed read as their defaults.
        """
        return CheckpointRecord(os.fspath(path))

    def _directory(self) -> str:
        if self.dir is None:
            raise CheckpointError(
                "This checkpointer has no directory yet: pass Checkpointer(dir=...) "
                "or let a Nitro bind it to its run_dir."
            )
        return checked_path(self.dir, "the checkpoint directory")

    @property
    def _tmp_prefix(self) -> str:
        return f"{TMP_PREFIX}{self.run or 'legacy'}-"

    def _matches(self, entry: ManifestEntry) -> bool:
        return is_scored_under(entry, self.metric, self.mode)

    def _naming(self) -> tuple[Callable[..., str], str]:
        """The function that names records, and what an error calls it."""
        return name_function(self.name, self._bound_name)

    def save(
        self,
        *,
        epoch: int,
        step: int,
        metrics: Mapping[str, Any],
        trees: Mapping[str, Any],
        header: RecordHeader,
        stop_reason: str | None = None,
    ) -> bool:
        """Write epoch `epoch`'s record if a selector admits it; rotate the rest.

        The record goes to a temporary file renamed into place, then the manifest
        is replaced, and only then are the rotated files deleted. A re-trained
        epoch of this run replaces its old entry. The first save after `bind` also
        finishes what a killed write left (`recover`).

        Args:
            epoch: the epoch just trained (from 1).
            step: the optimizer step it ended on.
            metrics: the epoch's scalar validation metrics; the score is
                `metrics[self.metric]` (none without a metric, or with no
                metrics: a run with no val split).
            trees: the pytrees to store, by prefix ("params", "state",
                "opt_state", ...); arrays are stored on the host.
            header: the record's header; this checkpointer fills in its `run`,
                `metrics` and `stop_reason`.
            stop_reason: how the run ended, when this is its last epoch; else None.

        Returns:
            bool: whether the record was written. False when no selector admits
            the epoch, and in every process but rank 0 of a run across
            processes: nothing is written then.

        Raises:
            CheckpointError: no directory yet; the metric is missing from
                `metrics`, or is not a finite real number; no free filename (every
                variant belongs to another run).
            ConfigError: the `name` function returned something that is not a
                bare filename.
            OSError: writing failed (a transient error is retried first).
        """
        # Across processes, an fsdp leaf is split over every process's devices:
        # each process joins the gathering (a collective), and rank 0 writes.
        trees = {k: gather_split_leaves(v) for k, v in trees.items()}
        if not is_rank0():  # rank 0 writes for a run across processes
            return False
        directory = self._directory()
        manifest = load_manifest(directory) if self._recovered else self._recover()
        all_entries = manifest.entries
        score = self._score(metrics)
        metric = self.metric if score is not None else None
        mode = self.mode if score is not None else None
        own = [e for e in all_entries if e.run == self.run]
        # A re-trained epoch (a resume that branched nowhere) replaces its old entry.
        replaced = [e for e in own if e.epoch == epoch]
        own_pool = [e for e in own if e.epoch != epoch and self._matches(e)]
        others = others_ranked(
            all_entries,
            run=self.run,
            scope=self.scope,
            metric=self.metric,
            mode=self.mode,
        )
        named = record_filename(
            *self._naming(), epoch=epoch, step=step, metric=metric, score=score
        )
        filename = free_filename(directory, all_entries, replaced, named, run=self.run)
        candidate = ManifestEntry(
            file=filename,
            epoch=epoch,
            step=step,
            score=score,
            stop_reason=stop_reason,
            run=self.run,
            metric=metric,
            mode=mode,
            written=time.time(),
            parent=self.parent,
        )

        kept = kept_entries(self, candidate, own_pool, others)
        if kept is None:
            self._last_saved = None
            return False
        if not os.path.lexists(manifest_path(directory)) and not holds_records(
            directory
        ):
            # A fresh directory gets its manifest before its first record, so
            # records without a manifest always mean a lost one (rebuilt by
            # lookups), never a kill between a first record and its manifest.
            write_manifest(directory, [], tmp_prefix=self._tmp_prefix)
        path = os.path.join(directory, filename)
        save_record(
            path,
            trees,
            dataclasses.replace(
                header, run=self.run, metrics=dict(metrics), stop_reason=stop_reason
            ),
            tmp_prefix=self._tmp_prefix,
        )
        # The manifest records what it lists: a file copied over this name later
        # is refused at lookup, not resumed as this run's.
        _, checksum = read_header_checksummed(path)
        candidate = dataclasses.replace(candidate, checksum=checksum)
        dropped = [e for e in [*own_pool, *replaced, *others] if e not in kept]
        survivors, doomed = rotation(
            directory, all_entries, dropped, candidate, manifest.pending_deletion
        )
        write_manifest(directory, survivors, doomed, tmp_prefix=self._tmp_prefix)
        for name in doomed:
            remove_file(os.path.join(directory, name))
        self._last_saved = candidate
        return True

    def recover(self) -> None:
        """Finish what a killed write left: rotation's pending deletions, and this
        run's temporary files; write back a lost manifest, rebuilt from the
        records' headers. The first `save` after `bind` calls it.

        Raises:
            CheckpointError: no directory yet, or the manifest cannot be read.
        """
        self._recover()

    def _recover(self) -> Manifest:
        """`recover()`; the manifest it read (recovery leaves it unchanged)."""
        directory = self._directory()
        self._recovered = True
        return recover_directory(
            directory, metric=self.metric, mode=self.mode, tmp_prefix=self._tmp_prefix
        )

    def finalize(self, stop_reason: str) -> bool:
        """Record how the run ended in its last record, if a selector kept it.

        When the most recent `save` since `bind` wrote a record (it returned True) and
        the manifest still lists it, that record's header and manifest entry get
        `stop_reason`, each rewritten atomically. When that save declined the epoch,
        nothing is rewritten: the state training ended in is saved only if a
        selector keeps the last epoch. Returns whether the record now holds
        `stop_reason`. Call it once, when train() ends, with "completed",
        "early_stop", "requested", "preempted" or "error".

        Args:
            stop_reason: "completed", "early_stop", "requested", "preempted" or
                "error".

        Returns:
            bool: whether the last record now holds `stop_reason`.

        Raises:
            ConfigError: another `stop_reason`.
            CheckpointError: the manifest or the record cannot be read.
        """
        if stop_reason not in STOP_REASONS:
            raise ConfigError(
                f"finalize(stop_reason={stop_reason!r}): it is one of "
                f"{', '.join(STOP_REASONS)}."
            )
        saved, self._last_saved = self._last_saved, None
        if saved is None:
            return False
        directory = self._directory()
        manifest = load_manifest(directory)
        current = next(
            (
                e
                for e in manifest.entries
                if e.file == saved.file and e.run == saved.run
            ),
            None,
        )
        if current is None:
            return False
        if current.stop_reason == stop_reason:
            return True
        rewrite_header(
            os.path.join(directory, current.file),
            lambda header: dataclasses.replace(header, stop_reason=stop_reason),
            tmp_prefix=self._tmp_prefix,
        )
        updated = dataclasses.replace(current, stop_reason=stop_reason)
        write_manifest(
            directory,
            [updated if e is current else e for e in manifest.entries],
            manifest.pending_deletion,
            tmp_prefix=self._tmp_prefix,
        )
        return True

    def _score(self, metrics: Mapping[str, Any]) -> float | None:
        """The epoch's score; None (unscored: kept by no ranking selector) without
        a metric, without validation, or when the metric is NaN or infinite or the
        pass's forward outputs were (`is_unscored`), which evaluation has warned of.
        A value that is no real number still raises."""
        if self.metric is None or not metrics:
            return None
        if is_unscored(metrics, self.metric):
            return None
        return read_watched(
            metrics,
            self.metric,
            "checkpoint metric",
            error=CheckpointError,
            watcher=f"The checkpointer ranks by `{self.metric}`",
            hint=" Set `monitor` to one of them.",
        )
