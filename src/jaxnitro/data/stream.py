"""One phase's pass over a split, torn down whole by `close()`: a `PrefetchStream`,
or an `InlinePass` read on the consumer's thread.

A stream is built when a phase starts (by `batch_stream`, `eval_stream` or
`prepared_stream` in `prefetch`) and closed when it ends, on every exit path. Its
threads live in `pipeline`; the `inline` path (`NoPrefetch`) runs none and prepares
each batch on the consumer. `prefetch.open_pass` picks an `InlinePass` instead where
nothing is staged on a device and producing a batch costs nothing (a list of built
batches, a `NoPrefetch` split): threads would only add hand-offs.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar

import jax

from .channel import ChannelClosed
from .pipeline import (
    END,
    FanoutPlan,
    Ledger,
    Pipeline,
    Prepare,
    build_fanout,
    build_single,
    finished_items,
    shutdown_pass,
)
from .protocol import unwrap_source
from .sources import epoch_batches, pass_batches
from .threads import PassThread

T = TypeVar("T")


class Staged(NamedTuple):
    """One training batch: the host batch and its routed fields on the device."""

    host: Mapping[str, Any]
    """The source's batch, every field, host arrays of shape (B, ...)."""
    device: dict[str, jax.Array]
    """The routed fields only, as device arrays of shape (B, ...)."""


class EvalStaged(NamedTuple):
    """One evaluation chunk: unpadded host fields, padded device fields, real count."""

    host: Mapping[str, Any]
    """The chunk's fields on the host, unpadded: shape (n_real, ...)."""
    device: dict[str, jax.Array]
    """The routed fields padded to the eval width: shape (width, ...)."""
    n_real: int
    """Real samples in the chunk (<= width); outputs beyond it are padding."""
    ends_batch: bool = True
    """Whether this chunk is the last of its source batch (a wider batch is cut)."""


@dataclass(frozen=True)
class StreamStats:
    """What a stream measured so far."""

    batches: int
    """Items delivered to the consumer."""
    wait_seconds: float
    """Time the consumer spent blocked in `next()` (on `inline`, all of its time)."""
    elapsed_seconds: float
    """From construction to close (or to now, while open)."""
    peak_live: int
    """Most device batches alive at once among those this stream created."""

    def data_wait_frac(self, wall_seconds: float | None = None) -> float:
        """`wait_seconds` over `wall_seconds` (default: elapsed), clipped to [0, 1]."""
        wall = self.elapsed_seconds if wall_seconds is None else wall_seconds
        return min(1.0, max(0.0, self.wait_seconds / wall)) if wall > 0 else 0.0


class PrefetchStream(Generic[T]):
    """One pass over a split, yielding prepared items; close it on every exit path.

    Built by `batch_stream`, `eval_stream` or `prepared_stream` (in `prefetch`), not
    directly. Iterating yields `Staged(host, device)` pairs (training) or
    `EvalStaged(host, device, n_real)` (evaluation). The consumer frees each device
    batch with `release(item.device)` once the step that used it has been
    dispatched or read back; `close()` frees everything still alive, stops every
    thread (waiting only for the one that holds device memory) and is idempotent.
    Also a context manager; a stream dropped without `close()` is closed when
    garbage-collected. With `stage=False` the items hold host arrays only, and the
    fan-out's workers prepare them (no transfer thread).
    """

    def __init__(
        self,
        source: Any,
        prepare: Prepare,
        *,
        path: str,
        name: str,
        workers: int,
        device_batches: int,
        host_batches: int,
        ordered: bool,
        set_epoch: Callable[[], None],
        stage: bool = True,
        join_timeout: float = 10.0,
    ) -> None:
        self.path = path
        self.name = name
        self._ledger = Ledger()
        self._started = time.perf_counter()
        self._stopped: float | None = None
        self._wait = 0.0
        self._batches = 0
        self._done = False
        self._pipeline: Pipeline | None = None
        self._inline: Generator[Any, None, None] | None = None
        self._error: BaseException | None = None
        self._join_timeout = join_timeout
        if path == "inline":
            self._inline = self._inline_items(source, prepare, set_epoch)
        else:
            # Staged items hold device memory: device_batches bounds them. Without
            # staging the channel holds host batches, which host_batches bounds.
            capacity = device_batches if stage else max(device_batches, host_batches)
            pipeline = Pipeline(name, self._ledger, capacity)
            if path in ("fanout", "fanout_unordered"):
                set_epoch()
                plan = FanoutPlan(source, workers, host_batches, ordered, stage)
                build_fanout(pipeline, plan, prepare)
            else:
                build_single(pipeline, source, prepare, set_epoch)
            self._pipeline = pipeline
        self._finalizer = weakref.finalize(
            self, shutdown_pass, self._pipeline, self._ledger, join_timeout, False
        )
        self._finalizer.atexit = False  # daemon threads; the process frees memory
        if self._pipeline is not None:
            self._pipeline.start()

    def _inline_items(
        self, source: Any, prepare: Prepare, set_epoch: Callable[[], None]
    ) -> Generator[Any, None, None]:
        set_epoch()
        for batch in pass_batches(source):
            for item in prepare(batch):
                self._ledger.add(item)
                yield item
        for item in finished_items(prepare):
            self._ledger.add(item)
            yield item

    def __iter__(self) -> PrefetchStream[T]:
        return self

    def __next__(self) -> T:
        if self._done:
            raise self._closed_error()
        started = time.perf_counter()
        try:
            item = self._next_item()
        except BaseException as error:
            if self._inline is not None and isinstance(error, Exception):
                self._error = error  # the source's error; StopIteration included
            self.close()
            raise
        finally:
            self._wait += time.perf_counter() - started
        self._batches += 1
        return item  # type: ignore[no-any-return]

    def _next_item(self) -> Any:
        if self._inline is not None:
            return next(self._inline)
        assert self._pipeline is not None
        try:
            item = self._pipeline.output.get()
        except ChannelClosed:
            raise self._closed_error() from None
        if item is END:
            raise StopIteration
        return item

    def _closed_error(self) -> BaseException:
        error = self._pipeline.error if self._pipeline is not None else self._error
        return error if error is not None else StopIteration()

    def release(self, device: Any) -> None:
        """Free one device batch this stream yielded (its `.device`); idempotent.

        Call it once the step using the batch is dispatched: it also wakes the
        producers if room came back for them, so their Python runs while the
        consumer waits on the device rather than during its next dispatch.
        """
        self._ledger.free(device)
        if self._pipeline is not None:
            self._pipeline.output.wake()

    def close(self, *, wait: bool = False) -> None:
        """Stop every thread and free every device batch still alive; idempotent.

        Only the thread that holds device memory (the transfer thread, or the one
        producer) is joined: a worker in the middle of a slow `batch_at` would
        delay an early exit (a stop request, an error) for as long as it takes,
        and it exits on its own after its current batch. `wait=True` joins every
        thread (each for at most the stream's `join_timeout`).
        """
        if self._stopped is None:
            self._stopped = time.perf_counter()
        self._done = True
        if self._inline is not None:
            self._inline.close()
        self._finalizer.detach()
        shutdown_pass(self._pipeline, self._ledger, self._join_timeout, wait)

    @property
    def wait_seconds(self) -> float:
        """Time the consumer spent blocked in `next()` so far, as `stats()` counts."""
        return float(self._wait)

    def stats(self) -> StreamStats:
        """Batches delivered, time blocked in `next()`, elapsed time, peak live."""
        end = self._stopped if self._stopped is not None else time.perf_counter()
        return StreamStats(
            batches=self._batches,
            wait_seconds=self._wait,
            elapsed_seconds=end - self._started,
            peak_live=self._ledger.peak,
        )

    @property
    def threads(self) -> tuple[PassThread, ...]:
        """The stream's threads (none on the `inline` path), each run by a pooled
        thread (`threads.py`)."""
        return tuple(self._pipeline.threads) if self._pipeline is not None else ()

    def __enter__(self) -> PrefetchStream[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class InlinePass:
    """One pass over a split prepared on the consuming thread, with its waiting time.

    Only reading the source's next batch counts as waiting: preparing it is the
    consumer's own work. Nothing is staged, so `release` frees nothing (the
    executable places the host arrays itself).
    """

    def __init__(self, split: Any, epoch: int, prepare: Prepare) -> None:
        seek = getattr(unwrap_source(split), "set_epoch", None)
        if callable(seek):  # as the stream does, so a resumed run reads the same order
            seek(epoch)
        self._batches = epoch_batches(split, epoch)
        self._prepare = prepare
        self._ready: list[Any] = []  # the rest of a batch cut into items, reversed
        self._finished = False
        self.wait_seconds = 0.0

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        while not self._ready:
            if self._finished:
                raise StopIteration
            started = time.perf_counter()
            host = next(self._batches, None)  # (a batch is a mapping, never None)
            self.wait_seconds += time.perf_counter() - started
            if host is None:  # what the prepare held back comes last
                self._finished = True
                self._ready = list(reversed(finished_items(self._prepare)))
                continue
            items = self._prepare(host)
            if len(items) == 1:  # the common case: a batch is one item
                return items[0]
            self._ready = list(reversed(items))
        return self._ready.pop()

    def release(self, device: Any) -> None:
        """Nothing to free: the executable placed the host arrays itself."""

    def close(self) -> None:
        self._batches.close()  # type: ignore[attr-defined]
