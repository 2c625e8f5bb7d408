"""`manifest.json`: the run directory's list of retained checkpoints.

The manifest is the source of truth for which records a directory holds: lookups,
resume and retention read it and never list the directory. It is replaced atomically
(temporary file, fsync, rename), after the record it adds is in place and before the
files rotation drops are deleted, so every entry always names a complete record.

A kill can leave two kinds of file the manifest does not list, and neither is ever
loaded: a record renamed into place just before the manifest was replaced (the
resumed run retrains that epoch and overwrites it; a fresh directory's manifest is
written empty before its first record, so one always exists to leave it out of),
and files rotation had dropped
but not yet deleted. The manifest lists the latter under `pending_deletion`, and the
next write in the directory deletes them. The manifest is a file anyone can edit, so
a deletion is only ever of a file the framework wrote, by its own naming: a name
under `pending_deletion` that is not a record's (`notes.txt`, `.nitro.lock`, a path)
is dropped with a warning, and a file a rotation or recovery would delete is first
read as a jaxnitro record, kept with a warning when it is not one.

A manifest that is missing while records sit in the directory (deleted by hand,
lost in a copy) is rebuilt from the records' headers, with a warning: run, epoch,
step, stop_reason and checksum come from each header, the write time from the file.
A header holds the epoch's validation metrics but not which of them scored the
record, so a rebuilt entry is scored only when the reader knows the metric and mode
(a lookup through a checkpointer or a monitor; `nitro ckpt --repair DIR --metric
NAME --mode MODE`); the parent of a branched run is left empty. Lookups rebuild in
memory; a checkpointer writes the rebuilt manifest back before its first record
(`restore_lost_manifest`), so a run writing into such a directory keeps every
record listed. A manifest path that is not a regular file (a directory, a FIFO) is
refused by name, and only regular files are read as records.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import stat
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..errors import CheckpointError, NitroWarning, user_stacklevel
from .header import RecordHeader
from .io_retry import with_io_retry
from .paths import checked_path
from .record import (
    TMP_PREFIX,
    atomic_write,
    file_kind,
    json_object,
    read_header,
    read_header_checksummed,
)

RECORD_SUFFIX = ".safetensors"
NOT_A_RECORD_NAME = (
    "{path} lists {name!r} under pending_deletion, but that is not a name the "
    "framework gives a checkpoint record (a filename ending in {suffix}): only the "
    "records it wrote are ever deleted, so {name!r} is left alone. Remove it from "
    "pending_deletion in {path}."
)
NOT_A_RECORD_FILE = (
    "{path} is due for deletion (a rotation dropped it or the manifest lists it "
    "under pending_deletion), but it is not a jaxnitro checkpoint record ({why}): "
    "only the records the framework wrote are ever deleted, so it is left alone. "
    "Move or delete it yourself."
)
MANIFEST_NOT_FILE = (
    "{path} is a {kind}, not a regular file: the manifest is the JSON file "
    "manifest.json. Move the {kind} away, then `nitro ckpt --repair {directory}` "
    "rebuilds the manifest from the records beside it."
)
MANIFEST_REBUILT = (
    "{path} is missing, but {directory} holds {count} checkpoint record(s): the "
    "manifest was rebuilt from their headers (run, epoch, step, stop_reason, "
    "checksum; the write time from the file).{skipped}{scored} A run "
    "checkpointing here writes it back before its first record; `nitro ckpt "
    "--repair {directory}` writes it now."
)
MANIFEST_WRITTEN_BACK = (
    "{path} was missing beside {count} checkpoint record(s) in {directory}: it was "
    "rebuilt from their headers and written back before this run's first record, "
    "so every record stays listed.{skipped}{scored}"
)
SCORED_BY = (
    " Each is scored by the {metric} ({mode}) its header's metrics hold; one "
    "whose header lacks it is unscored."
)
UNSCORED = (
    " A header does not say which metric scored its record, so the rebuilt "
    'entries are unscored and "best" ranks none of them (`nitro ckpt --repair '
    "{directory} --metric NAME --mode min|max` scores them)."
)

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1


@dataclass(frozen=True)
class ManifestEntry:
    """One retained checkpoint, as the manifest lists it.

    Attributes:
        file: the record's basename in the run directory.
        epoch: the epoch it was written at; step the optimizer step.
        score: the retention metric's value, or None for a run with no val split.
        stop_reason: how the run ended, when this was its last record; else None.
        run: the id of the run that wrote it (None: a manifest from before run ids).
        metric, mode: what `score` measures and which way is better.
        written: the wall-clock `time.time()` of the write (0.0 for a legacy entry).
        parent: for a run branched from an earlier record, that record's path.
        checksum: the record's checksum (`read_header_checksummed`), so a file
            copied over its name is told apart; None for an entry from before
            checksums were recorded.
    """

    file: str
    epoch: int
    step: int
    score: float | None
    stop_reason: str | None
    run: str | None
    metric: str | None
    mode: str | None
    written: float
    parent: str | None
    checksum: str | None = None


class Manifest(NamedTuple):
    """A parsed manifest: its entries and the files rotation dropped."""

    entries: list[ManifestEntry]
    pending_deletion: list[str]


_FIELDS = tuple(f.name for f in dataclasses.fields(ManifestEntry))


def manifest_path(directory: str) -> str:
    """Where a run directory's manifest lives."""
    return os.path.join(directory, MANIFEST)


def load_manifest(
    directory: str,
    *,
    rebuild: bool = False,
    warn: bool = False,
    metric: str | None = None,
    mode: str | None = None,
) -> Manifest:
    """Parse the directory's manifest; an empty one when there is none.

    With `rebuild`, a missing manifest beside records is rebuilt in memory from
    the records' headers (see `rebuild_entries`, which `metric` and `mode` score
    by), with a NitroWarning when `warn`. The checkpointer's own reads never
    rebuild: it writes a lost manifest back first (`restore_lost_manifest`).

    Raises:
        CheckpointError: the manifest is damaged, or its path is not a regular file.
    """
    text = _read_manifest_text(directory)
    if text is None:
        if not rebuild:
            return Manifest([], [])
        entries, skipped = rebuild_entries(directory, metric=metric, mode=mode)
        if entries and warn:
            _warn_rebuilt(MANIFEST_REBUILT, directory, entries, skipped, metric, mode)
        return Manifest(entries, [])
    return _parse(manifest_path(directory), text)


def restore_lost_manifest(
    directory: str,
    *,
    metric: str | None,
    mode: str | None,
    tmp_prefix: str = TMP_PREFIX,
) -> bool:
    """Before a checkpointer's first write: when the manifest is missing but
    records sit beside it, rebuild it from their headers (scored by `metric` and
    `mode`) and write it, with a NitroWarning, so the records stay listed. Returns
    whether it did. A directory with no record is left alone.
    """
    if os.path.lexists(manifest_path(directory)) or not holds_records(directory):
        return False
    entries, skipped = rebuild_entries(directory, metric=metric, mode=mode)
    if not entries:
        return False
    write_manifest(directory, entries, tmp_prefix=tmp_prefix)
    _warn_rebuilt(MANIFEST_WRITTEN_BACK, directory, entries, skipped, metric, mode)
    return True


def _warn_rebuilt(
    template: str,
    directory: str,
    entries: list[ManifestEntry],
    skipped: Sequence[str],
    metric: str | None,
    mode: str | None,
) -> None:
    """Warn that a lost manifest was rebuilt from `entries` (`template` says how)."""
    warnings.warn(
        template.format(
            path=manifest_path(directory),
            directory=directory,
            count=len(entries),
            skipped=_skipped_note(skipped),
            scored=_scored_note(directory, metric, mode),
        ),
        NitroWarning,
        stacklevel=user_stacklevel(),
    )


def _scored_note(directory: str, metric: str | None, mode: str | None) -> str:
    if metric is None or mode is None:
        return UNSCORED.format(directory=directory)
    return SCORED_BY.format(metric=metric, mode=mode)


def _read_manifest_text(directory: str) -> str | None:
    """The manifest's text; None when there is none. Only a regular file is read:
    a directory or a FIFO at that path is refused by name (a FIFO would block)."""
    path = manifest_path(checked_path(directory, "the run directory"))

    def read() -> str | None:
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            return None
        if not stat.S_ISREG(mode):
            raise CheckpointError(
                MANIFEST_NOT_FILE.format(
                    path=path, kind=file_kind(mode), directory=directory
                )
            )
        try:
            with open(path, encoding="utf-8") as f:
                return f.read()
        except FileNotFoundError:
            return None

    return with_io_retry(read, what=f"reading {path}")


def _parse(path: str, text: str) -> Manifest:

    def not_manifest(kind: str) -> str:
        return (
            f"{path} is not a jaxnitro manifest: expected an object with an "
            f'"entries" list, got {kind}.'
        )

    raw = json_object(
        text,
        lambda error: (
            f"{path} is not valid JSON ({error}). The manifest is replaced atomically, "
            f"so something else wrote it; restore it from a backup or delete it (the "
            f"records beside it stay readable by path)."
        ),
        not_manifest,
    )
    if not isinstance(raw.get("entries", []), list):
        raise CheckpointError(not_manifest(type(raw).__name__))
    entries = [_entry(path, i, item) for i, item in enumerate(raw.get("entries", []))]
    pending = raw.get("pending_deletion", [])
    if not isinstance(pending, list) or not all(isinstance(p, str) for p in pending):
        raise CheckpointError(f"{path}: pending_deletion must be a list of filenames.")
    for name in pending:
        if not is_record_name(name):
            warnings.warn(
                NOT_A_RECORD_NAME.format(path=path, name=name, suffix=RECORD_SUFFIX),
                NitroWarning,
                stacklevel=user_stacklevel(),
            )
    return Manifest(entries, [p for p in pending if is_record_name(p)])


def is_record_name(name: str) -> bool:
    """Whether `name` is one the framework gives a checkpoint record: a basename
    ending in `.safetensors` (the default names and a name hook's, which setup
    completes with the suffix), not a temporary (`.tmp-...`), without a NUL byte.

    >>> is_record_name("epoch-0002-step-8.safetensors"), is_record_name("notes.txt")
    (True, False)
    """
    return (
        _is_basename(name)
        and name.endswith(RECORD_SUFFIX)
        and name != RECORD_SUFFIX
        and not name.startswith(TMP_PREFIX)
        and "\x00" not in name
    )


def is_deletable_record(directory: str, name: str) -> bool:
    """Whether the file `name` in `directory` may be deleted by rotation or
    recovery: a record's name (`is_record_name`) and, when it exists, a regular
    file whose header reads as a jaxnitro record. Warns naming a file it keeps.
    A name already gone is deletable (deleting it does nothing)."""
    if not is_record_name(name):
        return False
    path = os.path.join(directory, name)
    if not os.path.lexists(path):
        return True
    try:
        read_header(path)
    except CheckpointError as error:
        warnings.warn(
            NOT_A_RECORD_FILE.format(path=path, why=error),
            NitroWarning,
            stacklevel=user_stacklevel(),
        )
        return False
    return True


def _is_basename(name: str) -> bool:
    return bool(name) and os.path.basename(name) == name and name not in (".", "..")


def _entry(path: str, index: int, item: Any) -> ManifestEntry:
    if not (
        isinstance(item, dict)
        and isinstance(item.get("file"), str)
        and _is_basename(item["file"])
        and isinstance(item.get("epoch"), int)
    ):
        raise CheckpointError(
            f"{path}: entry {index} is {item!r}; every entry needs a `file` (a "
            f"basename) and an integer `epoch`. The manifest is damaged."
        )
    values: dict[str, Any] = {name: item.get(name) for name in _FIELDS}
    values["written"] = float(values["written"] or 0.0)
    values["step"] = int(values["step"] or 0)
    if values["score"] is not None:
        values["score"] = float(values["score"])
    return ManifestEntry(**values)


def holds_records(directory: str) -> bool:
    """Whether `directory` holds a file named like a checkpoint record."""
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return any(
        n.endswith(RECORD_SUFFIX) and not n.startswith(TMP_PREFIX) for n in names
    )


def _skipped_note(skipped: Sequence[str]) -> str:
    if not skipped:
        return ""
    return f" Left out, not readable as records: {'; '.join(skipped)}."


def rebuild_entries(
    directory: str,
    *,
    known: Sequence[ManifestEntry] = (),
    metric: str | None = None,
    mode: str | None = None,
) -> tuple[list[ManifestEntry], list[str]]:
    """Manifest entries for the records in `directory`, read from their headers.

    Only regular files named `*.safetensors` are read (never a FIFO, which would
    block; never a lock or log file). An entry of `known` (a manifest being
    repaired) is kept as it is for a file that still holds the record it lists; any
    other record gets an entry from its header, scored by `metrics[metric]` when
    `metric` (with `mode`) is given and the header holds it, else unscored.

    Returns:
        The entries, oldest write first, and one line per file left out (not
        readable as a record), naming it and why.
    """
    by_file = {e.file: e for e in known}
    entries: list[ManifestEntry] = []
    skipped: list[str] = []
    try:
        names = sorted(os.listdir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return [], []
    for name in names:
        if not name.endswith(RECORD_SUFFIX) or name.startswith(TMP_PREFIX):
            continue
        path = os.path.join(directory, name)
        try:
            info = os.stat(path)
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(info.st_mode):
            skipped.append(f"{name} (a {file_kind(info.st_mode)})")
            continue
        try:
            header, checksum = read_header_checksummed(path)
        except CheckpointError as error:
            skipped.append(f"{name} ({error})")
            continue
        listed = by_file.get(name)
        if listed is not None and is_listed_record(listed, header, checksum):
            entries.append(listed)
            continue
        value = header.metrics.get(metric) if metric is not None else None
        score = None
        if isinstance(value, int | float) and not isinstance(value, bool):
            score = float(value)
        scored = score is not None and mode is not None
        entries.append(
            ManifestEntry(
                file=name,
                epoch=header.epoch,
                step=header.step,
                score=score if scored else None,
                stop_reason=header.stop_reason,
                run=header.run,
                metric=metric if scored else None,
                mode=mode if scored else None,
                written=info.st_mtime,
                parent=None,
                checksum=checksum,
            )
        )
    entries.sort(key=lambda e: (e.written, e.epoch))
    return entries, skipped


def is_listed_record(entry: ManifestEntry, header: RecordHeader, checksum: str) -> bool:
    """Whether a file with `header` and `checksum` is the record `entry` lists. An
    entry from before checksums were recorded cannot be checked, and passes."""
    if entry.checksum is None:
        return True
    return (header.run, header.epoch, header.step, checksum) == (
        entry.run,
        entry.epoch,
        entry.step,
        entry.checksum,
    )


def repair_manifest(
    directory: str, *, metric: str | None = None, mode: str | None = None
) -> tuple[list[ManifestEntry], list[str]]:
    """Rewrite `directory`'s manifest from the records there (`nitro ckpt
    --repair`): a readable manifest's entries are kept for the files that still
    hold the record listed, a damaged manifest is replaced, and any other record
    is listed from its header (scored by `metric`/`mode` when given); a damaged
    record is left out.

    Returns:
        The entries written, and the files left out (see `rebuild_entries`).

    Raises:
        CheckpointError: the manifest path is not a regular file (move it away
            first), or `directory` holds no record.
    """
    if mode is not None and mode not in ("min", "max"):
        raise CheckpointError(f'--mode is "min" or "max", not {mode!r}.')
    if (metric is None) != (mode is None):
        raise CheckpointError(
            f"--metric {metric} --mode {mode}: give both (the metric that scores "
            f"the records and which way is better), or neither."
        )
    known: list[ManifestEntry] = []
    text = _read_manifest_text(directory)  # a directory or FIFO there: refused
    if text is not None:
        with contextlib.suppress(CheckpointError):  # a damaged one is replaced
            known = _parse(manifest_path(directory), text).entries
    entries, skipped = rebuild_entries(directory, known=known, metric=metric, mode=mode)
    if not entries:
        raise CheckpointError(
            f"{directory} holds no readable checkpoint record to rebuild a manifest "
            f"from.{_skipped_note(skipped)}"
        )
    write_manifest(directory, entries)
    return entries, skipped


def read_manifest(
    directory: str,
    *,
    warn: bool = True,
    metric: str | None = None,
    mode: str | None = None,
) -> list[ManifestEntry]:
    """The checkpoints a run directory holds, without opening one (empty if none).

    A lost manifest is rebuilt from the records' headers (scored by `metric` and
    `mode` when given), with a NitroWarning unless `warn` is False. Raises
    `CheckpointError`, naming the file, when the manifest is damaged or its path
    is not a regular file.
    """
    return load_manifest(
        directory, rebuild=True, warn=warn, metric=metric, mode=mode
    ).entries


def write_manifest(
    directory: str,
    entries: Sequence[ManifestEntry],
    pending_deletion: Sequence[str] = (),
    *,
    tmp_prefix: str = TMP_PREFIX,
) -> None:
    """Replace the manifest atomically."""
    data: dict[str, Any] = {
        "format": MANIFEST_FORMAT,
        "entries": [dataclasses.asdict(e) for e in entries],
    }
    if pending_deletion:
        data["pending_deletion"] = list(pending_deletion)
    text = json.dumps(data, indent=1)

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    atomic_write(manifest_path(directory), write, prefix=tmp_prefix)


def remove_file(path: str) -> None:
    """Delete a checkpoint file (rotation); one already gone is fine."""

    def remove() -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)

    with_io_retry(remove, what=f"deleting {path}")
