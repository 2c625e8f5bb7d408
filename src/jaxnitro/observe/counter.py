"""The progress counter: units of work this process has completed.

One unit per optimizer step in training and one per batch in evaluation; the loop
calls `advance_progress_counter()` at each. Only changes are meaningful: a run stays
in TrainStepping for a whole epoch, so a stall watchdog compares the count across two
observations to measure the time since the last completed unit. Evaluation batches
count because nothing on the handle advances during an eval loop.

Example:
    >>> before = progress_counter()
    >>> advance_progress_counter()
    >>> progress_counter() - before
    1
"""

from __future__ import annotations

import threading

from ..errors import NitroError

_lock = threading.Lock()
_count = 0


def progress_counter() -> int:
    """The number of units of work completed in this process; never decreases."""
    return _count


def advance_progress_counter(units: int = 1) -> None:
    """Count `units` completed units (one optimizer step, or one eval batch, each)."""
    global _count
    if units < 0:
        raise NitroError(
            f"advance_progress_counter(units={units}): the progress counter is "
            f"monotonic, so units must be >= 0. Count completed steps or batches only."
        )
    with _lock:
        _count += units
