"""What setup checks about a checkpointer's retention, and the mixed-metric warning.

Pure functions of the checkpointer, the manifest entries and whether the handle
trains, so setup decides when to call them and tests call them directly:

* `check_keep` refuses keep with only ranking selectors (Best) for a training run
  with no val split, whose epochs have no score and would never be kept;
* `missing_last_warning`: keep has no Last, so a crash loses every epoch since the
  last kept one, and "latest" means the latest kept epoch;
* `scope_deletion_warning`: under scope "dir" the directory already holds other
  runs' checkpoints that this run's writes may delete;
* `mixed_metrics_message` / `warn_mixed_metrics`: some entries were scored under
  another metric or mode; they are kept but never ranked.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Sequence
from typing import Any

from ..errors import ConfigError, NitroWarning
from .checkpointer import Checkpointer
from .manifest import ManifestEntry
from .retention import others_ranked
from .selectors import is_scored_under

NO_VAL_ONLY_BEST = (
    "The checkpointer keeps only Best checkpoints, but this run has no val split, so "
    "its epochs have no score and none would be kept. Add Last(n) to keep, or add a "
    "val split."
)


def check_keep(ckpt: Checkpointer, *, trains: bool, has_val: bool) -> None:
    """Refuse keep with only ranking selectors for a training run with no val split."""
    if trains and not has_val and ckpt.only_ranks:
        raise ConfigError(NO_VAL_ONLY_BEST + f" keep={ckpt.keep!r}.")


def missing_last_warning(ckpt: Checkpointer, *, trains: bool) -> str | None:
    """The warning for a training handle whose keep has no Last, else None."""
    if not trains or ckpt.has_last:
        return None
    return (
        f"The checkpointer's keep={ckpt.keep!r} has no Last: an epoch no selector "
        f"keeps is not written, so a crash loses every epoch since the last kept one, "
        f'and resume="auto" or ("latest", "latest") resolve to that epoch, not to '
        f"where training stopped. Add Last(1) to keep to save every epoch."
    )


def scope_deletion_warning(
    ckpt: Checkpointer, entries: Sequence[ManifestEntry], *, trains: bool
) -> str | None:
    """The warning for scope "dir" when other runs' checkpoints may be deleted."""
    if not trains or ckpt.scope != "dir":
        return None
    others = others_ranked(
        entries, run=ckpt.run, scope=ckpt.scope, metric=ckpt.metric, mode=ckpt.mode
    )
    if not others:
        return None
    runs = sorted({str(e.run) if e.run is not None else "legacy" for e in others})
    return (
        f'Checkpointer(scope="dir") ranks every run in {ckpt.dir!r}: this run\'s '
        f"writes may delete any of the {len(others)} checkpoints of run(s) "
        f"{', '.join(runs)} scored under {ckpt.metric}/{ckpt.mode} that its Best "
        f'selectors do not keep. Use scope="run" (the default) to leave other runs\' '
        f"checkpoints alone."
    )


def mixed_metrics_message(
    entries: Sequence[ManifestEntry],
    metric: str | None,
    mode: str | None,
    what: str,
) -> str | None:
    """The text of `warn_mixed_metrics`, or None when nothing is mixed."""
    other = Counter(
        (e.metric, e.mode)
        for e in entries
        if e.score is not None and not is_scored_under(e, metric, mode)
    )
    if not other:
        return None
    pairs = ", ".join(f"{m}/{d}: {n}" for (m, d), n in sorted(other.items()))
    return (
        f"{what}: {sum(other.values())} checkpoint(s) were scored under another metric "
        f"or mode ({pairs}); they are kept, but only those under {metric}/{mode} are "
        f"ranked. Pass Checkpointer(metric=..., mode=...) to rank by another pair."
    )


def warn_mixed_metrics(
    entries: Sequence[ManifestEntry], checkpointer: Any, what: str
) -> None:
    """Warn (NitroWarning) when some `entries` were scored under another metric/mode.

    `checkpointer` is anything with `metric` and `mode` attributes.
    """
    message = mixed_metrics_message(
        entries, checkpointer.metric, checkpointer.mode, what
    )
    if message is not None:
        warnings.warn(message, NitroWarning, stacklevel=3)


def setup_warnings(
    ckpt: Checkpointer, entries: Sequence[ManifestEntry], *, trains: bool
) -> list[str]:
    """Every retention warning setup should emit for a handle, in order.

    Call it after `ckpt.bind(...)`, with `read_manifest(ckpt.dir)`.
    """
    if not trains:
        return []
    found = [
        missing_last_warning(ckpt, trains=trains),
        scope_deletion_warning(ckpt, entries, trains=trains),
    ]
    considered = [
        e
        for e in entries
        if e.run == ckpt.run or (ckpt.scope == "dir" and e.score is not None)
    ]
    found.append(
        mixed_metrics_message(
            considered,
            ckpt.metric,
            ckpt.mode,
            f"The checkpointer's retention in {ckpt.dir!r}",
        )
    )
    return [text for text in found if text is not None]
