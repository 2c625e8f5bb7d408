"""Worker threads a closed stream left running, by the source they read.

A stream closes without waiting for its workers (a worker inside a slow `batch_at`
would delay an early exit for seconds), so a worker may still be reading its source
after the stream is gone. Releasing that source then (closing a file or a client
under the read) would be a use after close: `release_source` waits for the workers
registered here first.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

from .threads import PassThread

_LOCK = threading.Lock()
_RUNNING: dict[int, list[PassThread]] = {}


def register(source: Any, threads: Iterable[PassThread]) -> None:
    """Record `threads`, alive after their stream closed, as readers of `source`."""
    alive = [t for t in threads if t.is_alive()]
    if not alive:
        return
    with _LOCK:
        # Threads that have ended are dropped on the way, for every source: one
        # without release() is never joined, and its entry must not grow.
        for key in list(_RUNNING):
            _RUNNING[key] = [t for t in _RUNNING[key] if t.is_alive()]
            if not _RUNNING[key]:
                del _RUNNING[key]
        _RUNNING[id(source)] = _RUNNING.get(id(source), []) + alive


def join(source: Any, timeout: float) -> list[str]:
    """Wait up to `timeout` seconds for the threads reading `source`; the names of
    those still running."""
    with _LOCK:
        threads = _RUNNING.pop(id(source), [])
    deadline = time.monotonic() + timeout
    for thread in threads:
        if not thread.runs_on(threading.current_thread()):
            thread.join(max(0.0, deadline - time.monotonic()))
    return [t.name for t in threads if t.is_alive()]
