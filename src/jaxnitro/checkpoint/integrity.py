"""Whether the file a manifest entry names is still the record it listed.

A listed record can be gone (deleted by hand), damaged (truncated by a full disk, a
header that no longer parses) or replaced: another valid record copied over its
name, whose run, epoch, step or checksum differ from what the manifest recorded.
Only the file's header is read, never its arrays. A resume must not continue from a
replaced record (its lineage is another run's), so a lookup refuses it by name;
`resume="auto"` steps back past a gone or damaged one (`lookup.resume_latest`),
and `nitro runs` marks all three.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import CheckpointError
from .manifest import ManifestEntry, is_listed_record
from .record import read_header_checksummed

MISSING = "missing"
DAMAGED = "damaged"
REPLACED = "replaced"

REPLACED_MESSAGE = """\
{path} is not the record the manifest of {directory} lists under that name: the \
manifest lists {listed}, but the file holds {held}. Another record was copied over \
it. Put the listed record back, or move the file away and run `nitro ckpt --repair \
{directory}` to list what the directory holds now."""


@dataclass(frozen=True)
class EntryProblem:
    """What is wrong with the file a manifest entry names.

    Attributes:
        entry: the manifest entry.
        kind: "missing", "damaged" or "replaced".
        detail: the reason, in words (the read error, or both records' identities).
    """

    entry: ManifestEntry
    kind: str
    detail: str


def describe(run: str | None, epoch: int, step: int, checksum: str | None) -> str:
    """`run aaa, epoch 3, step 12, checksum 1f2e...`: a record's identity."""
    label = "legacy" if run is None else run  # as lookup.run_label names it
    text = f"run {label}, epoch {epoch}, step {step}"
    return text if checksum is None else f"{text}, checksum {checksum}"


def entry_problem(directory: str, entry: ManifestEntry) -> EntryProblem | None:
    """What is wrong with `entry`'s file in `directory`; None when it is the record
    the manifest listed (`is_listed_record`). Reads the file's header only.
    """
    path = os.path.join(directory, entry.file)
    if not os.path.lexists(path):
        return EntryProblem(entry, MISSING, f"{path} is missing")
    try:
        header, checksum = read_header_checksummed(path)
    except CheckpointError as error:
        return EntryProblem(entry, DAMAGED, str(error))
    same = is_listed_record(entry, header, checksum)
    if same:
        return None
    detail = REPLACED_MESSAGE.format(
        path=path,
        directory=directory,
        listed=describe(entry.run, entry.epoch, entry.step, entry.checksum),
        held=describe(header.run, header.epoch, header.step, checksum),
    )
    return EntryProblem(entry, REPLACED, detail)


def check_listed(directory: str, entry: ManifestEntry) -> EntryProblem | None:
    """`entry_problem`, raising for a replaced record: its lineage is another run's.

    Raises:
        CheckpointError: the file holds another record than the one listed.
    """
    problem = entry_problem(directory, entry)
    if problem is not None and problem.kind == REPLACED:
        raise CheckpointError(problem.detail)
    return problem
