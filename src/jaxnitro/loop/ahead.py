"""Blocks staged ahead: the next block's stack and transfer on a worker thread.

On an accelerator a block's host work (its batches gathered, one `np.stack` per
field, the transfer started) cost the loop thread about 85 us a step on a TPU v5e
tutorial MLP, as much as the rest of the step. `Ahead` runs the calls loop's block
generator on a worker thread, `depth` blocks ahead of the calls that read them, so
that work overlaps the loop's dispatches (NumPy's copies and the transfer release
the interpreter's lock). Only for batches already in memory (a list of built
batches): producing one is a pointer load, so the worker never blocks in user code
and stops within a block when the loop ends early.

    >>> def numbers():
    ...     yield from range(3)
    >>> with Ahead(numbers()) as ahead:
    ...     list(ahead)
    [0, 1, 2]
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Generator, Iterator
from types import TracebackType
from typing import Any, Generic, TypeVar

T = TypeVar("T")

_END = object()
"""The worker's last item: the generator ran out."""
PUT_POLL_S = 0.05
"""How often a worker waiting for room in the queue checks whether it should stop."""


class Ahead(Generic[T]):
    """Iterate `items` (a generator) on a worker thread, up to `depth` items ahead.

    The items arrive in order; an exception the generator raises is raised to the
    consumer at its place in the order. `close()` (or leaving the `with` block)
    stops the worker after the item it is making and closes the generator on the
    worker's thread; it is safe to call twice.
    """

    def __init__(self, items: Generator[T, None, None], depth: int = 1) -> None:
        self._items = items
        self._queue: queue.Queue[tuple[bool, Any]] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(
            target=self._run, name="jaxnitro-blocks", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        try:
            for item in self._items:
                if not self._put((True, item)):
                    return
            self._put((True, _END))
        except BaseException as error:  # raised to the consumer, in order
            self._put((False, error))
        finally:
            self._items.close()

    def _put(self, entry: tuple[bool, Any]) -> bool:
        """Queue `entry`, waiting for room; False when the consumer stopped."""
        while not self._stop.is_set():
            try:
                self._queue.put(entry, timeout=PUT_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        ok, value = self._queue.get()
        if not ok:
            self._done = True
            raise value
        if value is _END:
            self._done = True
            raise StopIteration
        return value  # type: ignore[no-any-return]

    def close(self) -> None:
        """Stop the worker and wait for it (it finishes the item it is making)."""
        self._done = True
        self._stop.set()
        while True:  # room for a worker blocked on a full queue
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join()

    def __enter__(self) -> Ahead[T]:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()
