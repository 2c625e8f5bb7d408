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

    A producer blocked on a full channel is woken when half of it has drained (at
    once for a capacity of 1), so a fast producer refills in bursts.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"`capacity` must be >= 1, got {capacity}.")
        self._capacity = capacity
        self._items: deque[T] = deque()
        self._closed = False
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
            while not self._items and not self._closed:
                self._not_empty.wait()
            if self._closed:
                raise ChannelClosed
            item = self._items.popleft()
            # A producer blocked on a full channel is woken once half of it is
            # free, not per item: each wake-up costs the consumer's core time.
            if len(self._items) <= self._capacity // 2:
                self._not_full.notify()
            return item

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
