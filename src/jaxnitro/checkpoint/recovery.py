"""Finishing what a killed write left in a checkpoint directory.

A write renames a complete record into place, replaces the manifest, then deletes
the rotated files, so a kill at any instant leaves a readable directory, with at
most: a lost manifest (records written, none listed), files the manifest marks for
deletion, and the writing run's temporary files. `recover_directory` finishes each;
a checkpointer calls it before its first save after `bind`.
"""

from __future__ import annotations

import os

from .manifest import (
    Manifest,
    is_deletable_record,
    load_manifest,
    remove_file,
    restore_lost_manifest,
)


def recover_directory(
    directory: str, *, metric: str | None, mode: str | None, tmp_prefix: str
) -> Manifest:
    """Write back a lost manifest (rebuilt from the records' headers, scored under
    `metric`/`mode`), delete its pending deletions and the temporary files named
    with `tmp_prefix`; the manifest read (recovery leaves it unchanged)."""
    # A lost manifest is written back before this run's first record, or the
    # manifest it starts would list only the records written from then on.
    restore_lost_manifest(directory, metric=metric, mode=mode, tmp_prefix=tmp_prefix)
    manifest = load_manifest(directory)
    listed = {e.file for e in manifest.entries}
    for name in manifest.pending_deletion:
        if name not in listed and is_deletable_record(directory, name):
            remove_file(os.path.join(directory, name))
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return manifest
    for name in names:
        if name.startswith(tmp_prefix):
            remove_file(os.path.join(directory, name))
    return manifest
