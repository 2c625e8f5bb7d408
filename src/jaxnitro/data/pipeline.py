"""The threads behind a `PrefetchStream`: workers, a transfer thread, a ledger.

Threaded paths (`fanout`, `fanout_unordered`; one producer on the others):

    coordinator  --indices (workers)-->  N workers: batch_at(i, plan)
        ^                                      |
        |  credits (host_batches tokens)       v  (i, host batch)   (workers)
        +------------- returned on emit --  transfer thread: reorder buffer,
                                               prepare = [pad +] device_put
                                               |
                                               v  staged items   (device_batches)
                                            the consumer: next(stream)

The coordinator takes one credit per index it hands out, so at most `host_batches`
host batches exist between it and the transfer thread (in workers, in the hand-off
channel, in the reorder buffer). The transfer thread emits in index order (ordered)
or as batches arrive (unordered), and is the only thread that allocates device
memory. One producer (the `single*` and `materialized` paths) iterates the source and
prepares each batch itself. Any thread's exception closes every channel and is
re-raised, with its original traceback, by the consumer's next `next()`.

Device memory: every device batch the stream creates is recorded in a ledger until
`release(device)` (or `.delete()` on its arrays) frees it, and `close()` frees all
of them, handed out or still queued. At most `device_batches` sit in the channel, one
in the transfer thread's hand and one in the consumer's: `device_batches + 2`, if the
consumer releases each batch before asking for the next.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax

from ..errors import ConfigError, NitroWarning
from ..routing import as_batch
from .channel import Channel, ChannelClosed
from .protocol import BATCH_HINT, begin_epoch_checked, call_batch_at

Prepare = Callable[[Mapping[str, Any]], Sequence[Any]]
"""Host batch -> the items to yield for it, each with a `.device` pytree of arrays."""

END = object()
"""The last item a pass puts in its device channel."""


class Ledger:
    """Device batches the stream created and has not seen freed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: dict[int, tuple[Any, tuple[jax.Array, ...]]] = {}
        self.peak = 0

    def add(self, item: Any) -> None:
        device = getattr(item, "device", item)
        host_ids = {id(x) for x in _leaves(getattr(item, "host", ()))}
        owned = tuple(
            leaf
            for leaf in _leaves(device)
            if isinstance(leaf, jax.Array) and id(leaf) not in host_ids
        )
        if not owned:  # the source's own device arrays, passed through: not ours
            return
        with self._lock:
            for key in [k for k, (_, a) in self._live.items() if _all_deleted(a)]:
                del self._live[key]
            self._live[id(device)] = (device, owned)
            self.peak = max(self.peak, len(self._live))

    def free(self, device: Any) -> None:
        with self._lock:
            entry = self._live.pop(id(device), None)
        if entry is not None:
            _delete(entry[1])

    def free_item(self, item: Any) -> None:
        self.free(getattr(item, "device", item))

    def free_all(self) -> None:
        with self._lock:
            entries = list(self._live.values())
            self._live.clear()
        for _, arrays in entries:
            _delete(arrays)


def _leaves(tree: Any) -> Any:
    # A batch dict is one level deep: skip the pytree walk on the per-batch path.
    return tree.values() if type(tree) is dict else jax.tree_util.tree_leaves(tree)


def _all_deleted(arrays: tuple[jax.Array, ...]) -> bool:
    return all(a.is_deleted() for a in arrays)


def _delete(arrays: tuple[jax.Array, ...]) -> None:
    for array in arrays:
        if not array.is_deleted():
            array.delete()


class Pipeline:
    """The channels and threads of one stream; never refers to the stream itself."""

    def __init__(self, name: str, ledger: Ledger, device_batches: int) -> None:
        self.name = name
        self.ledger = ledger
        self.device: Channel[Any] = Channel(device_batches)
        self.channels: list[Channel[Any]] = [self.device]
        self.threads: list[threading.Thread] = []
        self.error: BaseException | None = None
        self._lock = threading.Lock()

    def channel(self, capacity: int) -> Channel[Any]:
        ch: Channel[Any] = Channel(capacity)
        self.channels.append(ch)
        return ch

    def spawn(self, role: str, target: Callable[[], None]) -> None:
        thread = threading.Thread(
            target=self._run,
            args=(target,),
            name=f"jaxnitro-prefetch-{self.name}-{role}",
            daemon=True,
        )
        self.threads.append(thread)

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def _run(self, target: Callable[[], None]) -> None:
        try:
            target()
        except ChannelClosed:
            pass  # torn down: another thread failed or the consumer closed
        except BaseException as raised:
            error = raised
            if isinstance(raised, StopIteration):  # would end the consumer's loop
                error = RuntimeError(f"{type(raised).__name__} raised on a thread")
                error.__cause__ = raised
            error.add_note(
                f"Raised on prefetch thread {threading.current_thread().name} of "
                f"split `{self.name}`, and re-raised on the consumer."
            )
            with self._lock:
                if self.error is None:
                    self.error = error
            self.abort()

    def put_staged(self, item: Any) -> None:
        """Put one staged item in the device channel, freeing it if torn down."""
        try:
            self.device.put(item)
        except ChannelClosed:
            self.ledger.free_item(item)
            raise

    def abort(self) -> None:
        """Close every channel, waking every thread; free the staged batches."""
        for ch in self.channels:
            for item in ch.close():
                if ch is self.device and item is not END:
                    self.ledger.free_item(item)

    def shutdown(self, timeout: float, wait: bool) -> None:
        """Close the channels and join the threads; `shutdown_pass` frees the ledger."""
        self.abort()
        me = threading.current_thread()
        deadline = time.monotonic() + timeout
        # The transfer thread (or the single producer) holds device memory: always
        # wait for it. Workers stop after their current batch; wait when asked.
        waited = self.threads[-1:] if not wait else self.threads[::-1]
        for thread in waited:
            if thread is not me and thread.is_alive():
                thread.join(max(0.0, deadline - time.monotonic()))
        stuck = [t.name for t in waited if t is not me and t.is_alive()]
        if stuck:
            warnings.warn(
                f"Prefetch thread(s) {', '.join(stuck)} of split `{self.name}` did "
                f"not stop within {timeout:g} s of the stream closing; they exit "
                f"after their current batch. A batch_at or __iter__ step that "
                f"blocks for long delays teardown.",
                NitroWarning,
                stacklevel=4,
            )


class FanoutPlan(NamedTuple):
    """The fan-out's settings for one pass."""

    source: Any
    workers: int
    host_batches: int
    ordered: bool


def _stage(pipeline: Pipeline, prepare: Prepare, host: Any) -> None:
    for item in prepare(as_batch(host, BATCH_HINT)):
        pipeline.ledger.add(item)
        pipeline.put_staged(item)


def build_fanout(pipeline: Pipeline, plan: FanoutPlan, prepare: Prepare) -> None:
    source, workers = plan.source, plan.workers
    epoch_plan = begin_epoch_checked(source, pipeline.name)
    count = len(source)  # read after begin_epoch: a plan may change it
    indices = pipeline.channel(workers)
    hosts = pipeline.channel(workers)
    credits = pipeline.channel(plan.host_batches)
    for _ in range(plan.host_batches):
        credits.put(None)

    def coordinator() -> None:
        for index in range(count):
            credits.get()
            indices.put(index)
        for _ in range(workers):
            indices.put(END)

    def worker() -> None:
        while True:
            index = indices.get()
            if index is END:
                hosts.put(END)
                return
            batch = call_batch_at(source, index, epoch_plan)
            if batch is None:
                raise ConfigError(
                    f"batch_at({index}) of split `{pipeline.name}` "
                    f"({type(source).__name__}) returned None; it must return a "
                    f"batch for every i in range(len(source)) = range({count})."
                )
            hosts.put((index, batch))

    def transfer() -> None:
        pending: dict[int, Any] = {}
        marks = bytearray(count)
        following = 0
        ended = 0
        while ended < workers:
            got = hosts.get()
            if got is END:
                ended += 1
                continue
            index, batch = got
            if marks[index]:
                raise RuntimeError(f"prefetch: batch {index} was built twice")
            marks[index] = 1
            if not plan.ordered:
                _stage(pipeline, prepare, batch)
                credits.put(None)
                continue
            pending[index] = batch
            while following in pending:
                _stage(pipeline, prepare, pending.pop(following))
                credits.put(None)
                following += 1
        if pending or not all(marks):
            raise RuntimeError(
                f"prefetch: the epoch of split `{pipeline.name}` ended with batches "
                f"undelivered ({count - sum(marks)} never built)"
            )
        pipeline.device.put(END)

    pipeline.spawn("coordinator", coordinator)
    for k in range(workers):
        pipeline.spawn(f"worker-{k}", worker)
    pipeline.spawn("transfer", transfer)


def build_single(
    pipeline: Pipeline, source: Any, prepare: Prepare, epoch: Callable[[], None]
) -> None:
    def producer() -> None:
        epoch()
        iterator = iter(source)
        try:
            for batch in iterator:
                _stage(pipeline, prepare, batch)
        finally:
            close = getattr(iterator, "close", None)
            if callable(close):
                close()
        pipeline.device.put(END)

    pipeline.spawn("producer", producer)


def shutdown_pass(
    pipeline: Pipeline | None, ledger: Ledger, timeout: float, wait: bool
) -> None:
    if pipeline is not None:
        pipeline.shutdown(timeout, wait)
    ledger.free_all()
