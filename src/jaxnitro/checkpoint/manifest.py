"""`manifest.json`: the run directory's list of retained checkpoints.

The manifest is the source of truth for which records a directory holds: lookups,
resume and retention read it and never list the directory. It is replaced atomically
(temporary file, fsync, rename), after the record it adds is in place and before the
files rotation drops are deleted, so every entry always names a complete record.

A kill can leave two kinds of file the manifest does not list, and neither is ever
loaded: a record renamed into place just before the manifest was replaced (the
resumed run retrains that epoch and overwrites it), and files rotation had dropped
but not yet deleted. The manifest lists the latter under `pending_deletion`, and the
next write in the directory deletes them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..errors import CheckpointError
from .io_retry import with_io_retry
from .record import TMP_PREFIX, atomic_write, json_object

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


class Manifest(NamedTuple):
    """A parsed manifest: its entries and the files rotation dropped."""

    entries: list[ManifestEntry]
    pending_deletion: list[str]


_FIELDS = tuple(f.name for f in dataclasses.fields(ManifestEntry))


def manifest_path(directory: str) -> str:
    """Where a run directory's manifest lives."""
    return os.path.join(directory, MANIFEST)


def load_manifest(directory: str) -> Manifest:
    """Parse the directory's manifest; an empty one when there is none."""
    path = manifest_path(directory)

    def read() -> str | None:
        try:
            with open(path, encoding="utf-8") as f:
                return f.read()
        except FileNotFoundError:
            return None

    text = with_io_retry(read, what=f"reading {path}")
    if text is None:
        return Manifest([], [])

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
    return Manifest(entries, [p for p in pending if _is_basename(p)])


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


def read_manifest(directory: str) -> list[ManifestEntry]:
    """The checkpoints a run directory holds, without opening one (empty if none).

    Raises `CheckpointError`, naming the file, when the manifest is damaged.
    """
    return load_manifest(directory).entries


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
