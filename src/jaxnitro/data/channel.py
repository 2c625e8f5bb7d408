"""A bounded FIFO between threads that teardown can close, waking every waiter.

`queue.Queue` cannot be closed before Python 3.13, so a thread blocked in `put` or
`get` could only be woken by a sentinel that may never fit. Closing a `Channel` makes
every blocked and every later `put`/`get` raise `ChannelClosed`, and hands back what
was still queued so the closer can free it (device buffers, credits).

>>> ch = Channel(2)
>>> ch.put(1); ch.put(2); ch.get()
1
>>> ch.close()
[2]
>>> ch.get()
Traceback (most recent call last):
...
jaxnitro.data.channel.ChannelClosed
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class ChannelClosed(Exception):
    """Raised by `Channel.put` and `Channel.get` once the channel is closed."""


class Channel(Generic[T]):
    """A bounded, closable FIFO; `capacity` items at most.

    A producer blocked on a full channel is due to be woken once half of it has
    drained (at once for a capacity of 1), so a fast producer refills in bursts.
    The consumer wakes it with `wake()` at a moment of its choosing (the training
    loop: once its step is dispatched, so the producer's Python runs while the
    consumer waits on the device, not during its dispatch); a `get` that finds
    the wake-up still due, or the channel empty, wakes it itself.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"`capacity` must be >= 1, got {capacity}.")
        self._capacity = capacity
        self._items: deque[T] = deque()
        self._closed = False
        self._wake_due = False
        lock = threading.Lock()
        self._not_full = threading.Condition(lock)
        self._not_empty = threading.Condition(lock)

    def put(self, item: T) -> None:
        """Append `item`, waiting for room; raise `ChannelClosed` once closed."""
        with self._not_full:
            while len(self._items) >= self._capacity and not self._closed:
                self._not_full.wait()
            if self._closed:
                raise ChannelClosed
            self._items.append(item)
            self._not_empty.notify()

    def get(self) -> T:
        """Remove the oldest item, waiting for one; raise `ChannelClosed` once closed.

        A closed channel raises even if items remain: closing is teardown, and the
        remaining items went back to the closer.
        """
        with self._not_empty:
            if self._wake_due or not self._items:
                self._wake_producer()
            while not self._items and not self._closed:
                self._not_empty.wait()
            if self._closed:
                raise ChannelClosed
            item = self._items.popleft()
            # Due once half of it is free, not per item: each wake-up costs the
            # consumer's core time.
            if len(self._items) <= self._capacity // 2:
                self._wake_due = True
            return item

    def wake(self) -> None:
        """Wake a producer blocked on a full channel, if room came back for it."""
        with self._not_full:
            if self._wake_due:
                self._wake_producer()

    def _wake_producer(self) -> None:
        self._wake_due = False
        self._not_full.notify()

    def close(self) -> list[T]:
        """Close the channel and return the items it held (empty on a second call)."""
        with self._not_full:
            self._closed = True
            left = list(self._items)
            self._items.clear()
            self._not_full.notify_all()
            self._not_empty.notify_all()
            return left

    @property
    def closed(self) -> bool:
        return self._closed

    def __len__(self) -> int:
        with self._not_full:
            return len(self._items)
