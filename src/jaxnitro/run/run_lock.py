"""`RunLockShare`: a handle's share of its run directory's lock.

A `resume=` handle takes it at setup, before it picks the record to continue; any
other handle when `train()` starts (`checkpoint/lock.py` says what the lock is). It
is let go when `train()` returns or raises, at `Nitro.release()`, or when the handle
is garbage collected (a smoke run's temporary directory goes with it then).
"""

from __future__ import annotations

from typing import Any

from ..checkpoint.lock import RunDirLock, lock_checkpoint_dir


class RunLockShare:
    """The lock a handle holds on the directory its checkpointer writes, if any.

    >>> share = RunLockShare(None)
    >>> share.held
    False
    >>> share.release()  # holding none: nothing to do
    """

    def __init__(self, lock: RunDirLock | None) -> None:
        self._lock = lock

    @property
    def held(self) -> bool:
        """Whether the handle holds its share now."""
        return self._lock is not None

    def take(self, checkpointer: Any, run_dir: str, *, purpose: str) -> None:
        """Take the lock of the directory `checkpointer` writes, unless held (a
        checkpointer of None, or another rank's process, takes nothing)."""
        if self._lock is None:
            self._lock = lock_checkpoint_dir(checkpointer, run_dir, purpose=purpose)

    def release(self) -> None:
        """Give up the handle's share of the lock, if it holds one."""
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.release()
