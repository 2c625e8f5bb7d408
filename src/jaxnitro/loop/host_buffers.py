"""Host arrays a block is stacked into, reused once nothing else holds them.

On a TPU v5e host (a gVisor sandbox) a prefetch thread stacked a tutorial MLP's
block of 16 batches (5 MB) in 5.2 ms into freshly allocated memory, against 1.1 ms
into memory it had written before (2026-12-07, each block timed on the thread; the
loop's own thread took 0.8 ms). The likely cause, not traced further: a fresh page
costs a fault in the sandbox, and a thread's allocator arena hands freed blocks back
to the system. So one `train()` keeps
the buffers its blocks were stacked into and stacks a later block of the same shape
and dtype into one that nothing else references any more.

Whether anything does is read from the buffer's reference count: the copy to the
device holds the NumPy array until the copy completes (JAX keeps it alive for an
asynchronous transfer), a device array that aliases it holds it (a CPU backend's
zero-copy placement), and so does any view of it (a block under accumulation, a
host block waiting for the call that reads it). A buffer still held is never
written; a new one is allocated instead.

    >>> buffers = HostBuffers()
    >>> first = buffers.empty((2, 3), np.float32)
    >>> buffers.empty((2, 3), np.float32) is first  # still held by `first`
    False
    >>> del first
    >>> buffers.empty((2, 3), np.float32).shape
    (2, 3)
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import numpy as np


def _references(held: list[np.ndarray], index: int) -> int:
    return sys.getrefcount(held[index])


_FREE = _references([np.empty(0)], 0)
"""The count `_references` reads for an array only the pool's list holds (what the
interpreter adds for the call itself differs between Python versions)."""


class HostBuffers:
    """One `train()`'s stacking buffers, `per_shape` at most of each shape and dtype
    and `most_bytes` in all (a larger request is served fresh and not kept).

    Thread-safe: the pass's in-order thread and the loop's thread may both stack.
    """

    def __init__(self, per_shape: int = 8, most_bytes: int = 512 * 2**20) -> None:
        self.per_shape = per_shape
        self.most_bytes = most_bytes
        self._held: dict[tuple[tuple[int, ...], np.dtype[Any]], list[np.ndarray]] = {}
        self._bytes = 0
        self._lock = threading.Lock()
        self.reused = 0  # buffers handed out again (for tests and benchmarks)

    def empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """An array of `shape` and `dtype` whose contents are undefined: a buffer
        of the pool that nothing else references, else a new one (kept while the
        pool has room)."""
        key = (tuple(shape), np.dtype(dtype))
        with self._lock:
            held = self._held.get(key, [])
            for index in range(len(held)):
                if _references(held, index) == _FREE:
                    self.reused += 1
                    return held[index]
            fresh = np.empty(key[0], key[1])
            if len(held) < self.per_shape and self._fits(fresh.nbytes, key):
                self._held[key] = [*held, fresh]
                self._bytes += fresh.nbytes
            return fresh

    def _fits(self, nbytes: int, key: Any) -> bool:
        """Whether `nbytes` more fit, after dropping other shapes' buffers if they
        must make room (a run whose batch shape changed keeps no stale ones)."""
        if nbytes > self.most_bytes:
            return False
        for other in [k for k in self._held if k != key]:
            if self._bytes + nbytes <= self.most_bytes:
                break
            self._bytes -= sum(a.nbytes for a in self._held.pop(other))
        return self._bytes + nbytes <= self.most_bytes
