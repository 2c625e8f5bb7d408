"""Where a phase's batches come from: the split's prefetch path, one pass at a time.

A list of built batches (the "materialized" path) and a `NoPrefetch` split are read
inline: producing a batch is a pointer load, and threads would only add hand-offs.
Every other split runs its prefetch stream: worker threads build the batches (calling
`batch_at` for a fan-out-capable source). A training pass keeps the routed fields on
the host: the calls loop stacks a block of steps' batches and places the stack with
one transfer (`calls.py`). An evaluation pass on an accelerator has a transfer thread
stage each padded chunk on the device ahead of its forward; on a CPU backend the host
arrays go to the executable as they are (it places them itself, and an explicit copy
would only cost time: benchmarks/prefetch.py).

Either way the training loop gets `Staged(host, routed)` items and the time it waited
for them, for the once-per-epoch `data_wait_frac`; evaluation gets `EvalStaged` chunks,
padded to the eval width by their producer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax

from ..data.pipeline import Prepare
from ..data.prefetch import (
    eval_prepare,
    prefetch_config,
    prepared_stream,
    routed_fields,
)
from ..data.protocol import unwrap_source
from ..data.sources import epoch_batches
from ..data.stream import Staged
from ..data.transfer import transfer
from ..devices.placement import Placement

INLINE_PATHS = ("materialized", "inline")


def stages_on_device() -> bool:
    """Whether batches are worth staging on the device ahead of the step; always
    across processes, where each batch is assembled from every process's rows."""
    return jax.default_backend() != "cpu" or jax.process_count() > 1


class InlineFeed:
    """One pass over a split prepared on the consuming thread, with its waiting time."""

    def __init__(self, split: Any, epoch: int, prepare: Prepare) -> None:
        seek = getattr(unwrap_source(split), "set_epoch", None)
        if callable(seek):  # as the stream does, so a resumed run reads the same order
            seek(epoch)
        self._batches = epoch_batches(split, epoch)
        self._prepare = prepare
        self._ready: Iterator[Any] = iter(())
        self.wait_seconds = 0.0

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        for item in self._ready:  # the rest of a batch cut into chunks
            return item
        started = time.perf_counter()
        try:
            host = next(self._batches)
        finally:
            self.wait_seconds += time.perf_counter() - started
        self._ready = iter(self._prepare(host))
        return next(self._ready)

    def release(self, device: Any) -> None:
        """Nothing to free: the executable placed the host arrays itself."""

    def close(self) -> None:
        self._batches.close()  # type: ignore[attr-defined]


class StreamFeed:
    """One pass over a split through its prefetch stream."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        return next(self._stream)

    @property
    def wait_seconds(self) -> float:
        return float(self._stream.stats().wait_seconds)

    def release(self, device: Any) -> None:
        self._stream.release(device)

    def close(self) -> None:
        self._stream.close()


def _open(
    split: Any, epoch: int, name: str, prepare: Prepare, on_device: bool
) -> InlineFeed | StreamFeed:
    if prefetch_config(split).path in INLINE_PATHS and not on_device:
        return InlineFeed(split, epoch, prepare)
    stream = prepared_stream(split, prepare, epoch=epoch, name=name, stage=on_device)
    return StreamFeed(stream)


def _as_is(routed: dict[str, Any]) -> dict[str, Any]:
    return routed


def _batch_sharding(placement: Placement | None) -> Any:
    """Where a staged batch goes: split over the run's mesh, else the default
    device."""
    return None if placement is None else placement.data_sharding


def open_feed(
    split: Any,
    *,
    epoch: int,
    fields: tuple[str, ...],
    name: str,
) -> InlineFeed | StreamFeed:
    """A training pass over `split` for 0-based `epoch`: `Staged(host, routed)`.

    `routed` holds the routed `fields`, each checked as `batch_stream` checks them,
    as host arrays (a field the source already put on the device stays there): the
    calls loop stacks a block of steps' batches and places the stack with one
    transfer (`calls.py`). Close it on every exit path.
    """

    def prepare(host: Mapping[str, Any]) -> list[Staged]:
        return [Staged(host, routed_fields(host, fields, name))]

    return _open(split, epoch, name, prepare, on_device=False)


def open_eval_feed(
    split: Any,
    *,
    select: Callable[[tuple[str, ...]], tuple[str, ...]],
    width: int,
    name: str,
    placement: Placement | None = None,
) -> InlineFeed | StreamFeed:
    """An evaluation pass over `split` (epoch 0's order): `EvalStaged` chunks.

    Each chunk's routed fields (`select(keys)`) are padded to `width` by whoever
    produces it (a prefetch thread, so the pad overlaps the previous forward, or the
    consumer on the inline paths); `host` stays unpadded. Close it on every exit.
    """
    on_device = stages_on_device()
    sharding = _batch_sharding(placement)
    place = (lambda part: transfer(part, sharding)) if on_device else _as_is
    return _open(split, 0, name, eval_prepare(select, width, name, place), on_device)
