"""The threads behind a `PrefetchStream`: workers, a transfer thread, a ledger.

The fan-out (`fanout`, `fanout_unordered`):

    coordinator: hands out indices against credits (host_batches), reorders
        |  claim(): the next index               ^  put(i, built)
        v                                        |
    N workers: batch_at(i, plan)  ---------------+   (and prepare, when not staging)
        take(): batches in index order (ordered) or as they finish (unordered)
        v
    staging:     transfer thread: prepare = [pad +] device_put --> channel of
                 device_batches --> the consumer: next(stream)
    not staging: the consumer takes the workers' prepared items itself

The coordinator is shared state under one lock, not a thread: a worker claims the
next index only while fewer than `host_batches` claimed batches are still unemitted
(in workers or in the reorder buffer), and emitting one returns its credit. Each
hand-off between threads costs a wake-up (tens of microseconds of core time on a
2-core host), so a pass uses as few as it can. Once half the credits (or half a
channel) are free, ONE producer is due, and it refills them all in a burst; the
consumer wakes it with `wake()` when it releases the batch whose step it has just
dispatched, so the producer's Python runs while the consumer waits on the device
instead of delaying its next dispatch (a consumer that never releases wakes it at
its next take). A taker that finds nothing ready wakes every worker: they are
behind. With staging (an accelerator), the transfer thread
is the only one that allocates device memory; without it (the CPU backend, whose
executables take host arrays), the workers also run the cheap `prepare` (routing
checks, eval padding) and the consumer reads the reorder buffer directly. One
producer (the `single*` and `materialized` paths) iterates the source and prepares
each batch itself. Any thread's exception closes every channel and is re-raised,
with its original traceback, by the consumer's next `next()`.

Device memory: every device batch the stream creates is recorded in a ledger until
`release(device)` (or `.delete()` on its arrays) frees it, and `close()` frees all
of them, handed out or still queued. At most `device_batches` sit in the channel, one
in the transfer thread's hand and one in the consumer's: `device_batches + 2`, if the
consumer releases each batch before asking for the next.

Teardown closes every channel, which stops every stage, and joins only the thread
that holds device memory (the transfer thread, or the one producer): a worker in
the middle of a slow `batch_at` would delay it, and exits on its own once its
batch is built, since every later hand-off raises `ChannelClosed`.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import jax

from ..errors import ConfigError, NitroWarning
from ..experiment.routing import as_batch
from . import stragglers
from .channel import Channel, ChannelClosed
from .protocol import BATCH_HINT, begin_epoch_checked, call_batch_at
from .sources import has_iter, pass_batches
from .threads import PassThread

Prepare = Callable[[Mapping[str, Any]], Sequence[Any]]
"""Host batch -> the items to yield for it (none, while it gathers several), each
with a `.device` pytree of arrays. A prepare with a `finish()` method is asked for
its last items once the source is exhausted, before the pass ends (the training
loop's block assembler: `loop/assembly.py`)."""

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

    def __init__(self, name: str, ledger: Ledger, capacity: int) -> None:
        self.name = name
        self.ledger = ledger
        self.device: Channel[Any] = Channel(capacity)
        """The prepared items on their way to the consumer, `capacity` at most."""
        self.output: Any = self.device
        """What the consumer reads (`get()`, and `wake()` once its step is
        dispatched): the device channel, or the fan-out's own items."""
        self.channels: list[Channel[Any] | Coordinator] = [self.device]
        self.threads: list[PassThread] = []
        self.holder: PassThread | None = None
        """The thread that holds device memory (transfer or producer), if any."""
        self.source: Any = None
        """The source the threads read, once known: released only after they end."""
        self.error: BaseException | None = None
        self._lock = threading.Lock()

    def spawn(self, role: str, target: Callable[[], None]) -> PassThread:
        thread = PassThread(
            lambda: self._run(target), name=f"jaxnitro-prefetch-{self.name}-{role}"
        )
        self.threads.append(thread)
        return thread

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
        """Close the channels and join the device-memory holder (every thread with
        `wait`); `shutdown_pass` frees the ledger."""
        self.abort()
        me = threading.current_thread()
        deadline = time.monotonic() + timeout
        # The transfer thread (or the single producer) holds device memory: always
        # wait for it. Workers stop after their current batch; wait when asked.
        if wait:
            waited = self.threads[::-1]
        else:
            waited = [self.holder] if self.holder is not None else []
        for thread in waited:
            if not thread.runs_on(me) and thread.is_alive():
                thread.join(max(0.0, deadline - time.monotonic()))
        others = [t for t in self.threads if not t.runs_on(me)]
        if not wait and self.source is not None:  # its release waits for them
            stragglers.register(self.source, others)
        stuck = [t.name for t in waited if t in others and t.is_alive()]
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
    stage: bool
    """Whether a transfer thread prepares the batches (it places them on a device)."""


def _stage(pipeline: Pipeline, prepare: Prepare, host: Any) -> None:
    _put_all(pipeline, prepare(as_batch(host, BATCH_HINT)))


def finished_items(prepare: Prepare) -> Sequence[Any]:
    """What `prepare` holds back until its source is exhausted (its `finish()`)."""
    finish = getattr(prepare, "finish", None)
    return () if finish is None else finish()


def _end(pipeline: Pipeline, prepare: Prepare) -> None:
    _put_all(pipeline, finished_items(prepare))
    pipeline.device.put(END)


def _put_all(pipeline: Pipeline, items: Sequence[Any]) -> None:
    for item in items:
        pipeline.ledger.add(item)
        pipeline.put_staged(item)


class Coordinator:
    """One fan-out pass's index claims, credits and reorder buffer, under one lock.

    Closable like a `Channel`: closing wakes every waiter, and every later call
    raises `ChannelClosed`.
    """

    def __init__(self, count: int, host_batches: int, ordered: bool) -> None:
        self._count, self._credits, self._ordered = count, host_batches, ordered
        lock = threading.Lock()
        self._room = threading.Condition(lock)  # a worker waits for a credit
        self._ready = threading.Condition(lock)  # the taker waits for its batch
        self._claimed = 0
        self._emitted = 0
        self._built: dict[int, Any] = {}
        self._closed = False
        self._wake_due = False

    def claim(self) -> int | None:
        """The next index to build, waiting for a credit; None once all are claimed."""
        with self._room:
            while (
                not self._closed
                and self._claimed < self._count
                and self._claimed - self._emitted >= self._credits
            ):
                self._room.wait()
            if self._closed:
                raise ChannelClosed
            if self._claimed == self._count:
                return None
            self._claimed += 1
            return self._claimed - 1

    def put(self, index: int, built: Any) -> None:
        """Hand in the batch built for a claimed index."""
        with self._ready:
            if self._closed:
                raise ChannelClosed
            self._built[index] = built
            if not self._ordered or index == self._emitted:
                self._ready.notify()

    def take(self) -> Any:
        """The next batch (in index order when ordered), or END after the last.

        Its credit goes back at once, but the workers hear of it only from `wake()`
        (or from the next `take`): see the wake-up policy in the module docstring.
        """
        with self._ready:
            if self._emitted == self._count and not self._closed:
                return END
            if not self._has_next():  # the workers are behind: every one builds
                self._wake_due = False
                self._room.notify_all()
            elif self._wake_due:  # freed by a take that no wake() followed
                self._wake_one()
            while not self._closed and not self._has_next():
                self._ready.wait()
            if self._closed:
                raise ChannelClosed
            if self._ordered:
                built = self._built.pop(self._emitted)
            else:
                built = self._built.pop(next(iter(self._built)))
            self._emitted += 1
            # A worker is due once half the credits are free, not per batch: it
            # refills them all in one burst, and each wake-up costs core time.
            if self._claimed - self._emitted <= self._credits // 2:
                self._wake_due = True
            return built

    def wake(self) -> None:
        """Wake one worker if credits came back since the workers last ran."""
        with self._room:
            if self._wake_due:
                self._wake_one()

    def _wake_one(self) -> None:
        # One worker, not all: it claims every free credit in turn. Should the
        # workers fall behind, the taker that waits wakes all of them.
        self._wake_due = False
        self._room.notify()

    def _has_next(self) -> bool:
        return self._emitted in self._built if self._ordered else bool(self._built)

    def close(self) -> list[Any]:
        """Close, waking every waiter; returns the batches still held."""
        with self._room:
            self._closed = True
            left = list(self._built.values())
            self._built.clear()
            self._room.notify_all()
            self._ready.notify_all()
            return left


class _Prepared:
    """The consumer's end of a fan-out without staging: the workers' items in turn."""

    def __init__(self, coordinator: Coordinator) -> None:
        self._coordinator = coordinator
        self._items: Iterator[Any] = iter(())

    def get(self) -> Any:
        for item in self._items:  # the rest of a batch cut into chunks
            return item
        built = self._coordinator.take()
        if built is END:
            return END
        self._items = iter(built)
        return next(self._items)

    def wake(self) -> None:
        self._coordinator.wake()


def build_fanout(pipeline: Pipeline, plan: FanoutPlan, prepare: Prepare) -> None:
    source = pipeline.source = plan.source
    epoch_plan = begin_epoch_checked(source, pipeline.name)
    count = len(source)  # read after begin_epoch: a plan may change it
    coordinator = Coordinator(count, plan.host_batches, plan.ordered)
    pipeline.channels.append(coordinator)

    def worker() -> None:
        while (index := coordinator.claim()) is not None:
            batch = call_batch_at(source, index, epoch_plan)
            if batch is None:
                raise ConfigError(
                    f"batch_at({index}) of split `{pipeline.name}` "
                    f"({type(source).__name__}) returned None; it must return a "
                    f"batch for every i in range(len(source)) = range({count})."
                )
            if plan.stage:
                coordinator.put(index, batch)
                continue
            items = prepare(as_batch(batch, BATCH_HINT))
            for item in items:
                pipeline.ledger.add(item)
            try:
                coordinator.put(index, items)
            except ChannelClosed:  # closed while preparing: nobody will take them
                for item in items:
                    pipeline.ledger.free_item(item)
                raise

    def transfer() -> None:
        while (batch := coordinator.take()) is not END:
            coordinator.wake()  # the workers build while this thread transfers
            _stage(pipeline, prepare, batch)
        _end(pipeline, prepare)

    for k in range(plan.workers):
        pipeline.spawn(f"worker-{k}", worker)
    if plan.stage:
        pipeline.holder = pipeline.spawn("transfer", transfer)
    else:
        pipeline.output = _Prepared(coordinator)


def build_single(
    pipeline: Pipeline, source: Any, prepare: Prepare, epoch: Callable[[], None]
) -> None:
    pipeline.source = source

    def producer() -> None:
        epoch()
        # A source without __iter__ is read as the inline path reads it (batch_at).
        iterator = iter(source) if has_iter(source) else pass_batches(source)
        try:
            for batch in iterator:
                _stage(pipeline, prepare, batch)
        finally:
            close = getattr(iterator, "close", None)
            if callable(close):
                close()
        _end(pipeline, prepare)

    pipeline.holder = pipeline.spawn("producer", producer)


def shutdown_pass(
    pipeline: Pipeline | None, ledger: Ledger, timeout: float, wait: bool
) -> None:
    if pipeline is not None:
        pipeline.shutdown(timeout, wait)
    ledger.free_all()
