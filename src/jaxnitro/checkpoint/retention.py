"""Which entries a save keeps, and what its rotation deletes.

Each selector of a checkpointer's `keep` picks from a pool of manifest entries: the
run's own entries scored as the checkpointer ranks, plus, under scope "dir" and for
a selector that ranks across runs (`Best`), the other runs' entries scored the same
way (`others_ranked`). A candidate record is written when some selector admits it
and the union of what the selectors pick still holds it (`kept_entries`). The
entries the pools held and the union dropped are rotated out, with the files an
earlier rotation could not delete (`rotation`); only files named and read as
jaxnitro records are ever deleted.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from .manifest import ManifestEntry, is_deletable_record
from .selectors import is_scored_under, selector_admits


def others_ranked(
    entries: Sequence[ManifestEntry],
    *,
    run: str | None,
    scope: str,
    metric: str | None,
    mode: str | None,
) -> list[ManifestEntry]:
    """Other runs' scored entries that a scope-"dir" checkpointer ranks (and may
    delete): those scored under `metric`/`mode`; none under scope "run"."""
    if scope != "dir":
        return []
    return [
        e
        for e in entries
        if e.run != run and e.score is not None and is_scored_under(e, metric, mode)
    ]


def kept_entries(
    checkpointer: Any,
    candidate: ManifestEntry,
    own_pool: Sequence[ManifestEntry],
    others: Sequence[ManifestEntry],
) -> list[ManifestEntry] | None:
    """The union of what `checkpointer.keep`'s selectors pick, `candidate` among
    them; None when no selector admits `candidate` or the union drops it.

    Each selector picks from `own_pool`, plus `others` under scope "dir" when it
    ranks across runs (`across_runs`), with the candidate added.
    """
    own, across = list(own_pool), [*own_pool, *others]

    def pool(selector: Any) -> list[ManifestEntry]:
        if checkpointer.scope == "dir" and getattr(selector, "across_runs", False):
            return across
        return own

    keep = checkpointer.keep
    admitted = any(selector_admits(s, pool(s), candidate, checkpointer) for s in keep)
    kept: list[ManifestEntry] = []
    for selector in keep:
        for entry in selector.select([*pool(selector), candidate], checkpointer):
            if entry not in kept:
                kept.append(entry)
    if not admitted or candidate not in kept:
        return None
    return kept


def rotation(
    directory: str,
    entries: Sequence[ManifestEntry],
    dropped: Sequence[ManifestEntry],
    written: ManifestEntry,
    pending_deletion: Sequence[str],
) -> tuple[list[ManifestEntry], list[str]]:
    """The manifest's entries after a save that wrote `written` and dropped
    `dropped`, and the files to delete once that manifest is in place.

    A file an earlier rotation could not delete stays listed for deletion until it
    is gone. Only files the framework wrote, by its own naming, are deleted: a
    crafted entry or pending deletion naming notes.txt or .nitro.lock deletes
    nothing.
    """
    survivors = [e for e in entries if e not in dropped] + [written]
    listed = {e.file for e in survivors}
    leftover = {
        name
        for name in pending_deletion
        if os.path.exists(os.path.join(directory, name))
    }
    doomed = sorted(({e.file for e in dropped} | leftover) - listed)
    return survivors, [n for n in doomed if is_deletable_record(directory, n)]
