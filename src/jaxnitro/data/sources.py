"""The data source protocol, as the training loop and evaluation consume it.

A split is any sized iterable of batches (`len()` counts batches), each batch a dict of
arrays with the batch dimension first. A source must be restartable: setup draws one
batch to learn the fields, and every epoch iterates it from the start, so a one-shot
iterator is refused (and an epoch that runs short, at its end: loop/steps.py). Two
optional methods make a source index-addressable: `begin_epoch() -> plan` and
`batch_at(i, plan)`. With both, the fan-out, the inline path and setup's probe read
`batch_at` over one plan per epoch; with `batch_at` alone, the source is iterated,
since it may re-plan in `__iter__` (see `reads_by_index`). One producer thread
iterates any source that has `__iter__`. A `grain.MapDataset` is indexed directly,
epoch `e` reading `ds[e * len(ds) + i]`, which gives a shuffled dataset a fresh
permutation each epoch that a resume reproduces.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..routing import as_batch
from .grain_adapter import GrainSource, grain_refusal
from .protocol import (
    BATCH_HINT,
    call_batch_at,
    fanout_capable,
    is_materialized,
    unwrap_source,
)
from .protocol import is_grain_map_dataset as _is_grain_map_dataset


def has_batch_at(source: Any) -> bool:
    """Whether the source implements the index-addressable trait."""
    return callable(getattr(unwrap_source(source), "batch_at", None))


def has_iter(source: Any) -> bool:
    """Whether the source's class defines `__iter__` (checked without calling it)."""
    return callable(getattr(type(unwrap_source(source)), "__iter__", None))


def reads_by_index(source: Any) -> bool:
    """Whether a pass off the fan-out reads `source` by `batch_at`, not `__iter__`.

    A source with the whole trait is read over one `begin_epoch()` plan, in the order
    the fan-out reads it. One with `batch_at` alone may re-plan in `__iter__`, which
    reading `batch_at` would skip, so it is iterated; without an `__iter__` nothing
    could re-plan it, and `batch_at` is read.
    """
    return fanout_capable(source) or (has_batch_at(source) and not has_iter(source))


def check_split(name: str, source: Any) -> int:
    """Validate a split's source and return its batch count.

    A `PrefetchIterator` or `NoPrefetch` is looked through; a Grain object that
    cannot be a split (an IterDataset, an iterator, a DataLoader, a MapDataset with a
    filter or an endless repeat) is refused naming the fix.
    """
    source = unwrap_source(source)
    # Every Grain refusal here, before the routing probe reads a batch: a filter's
    # hole at batch 0 would otherwise surface as a confusing routing error.
    refusal = grain_refusal(source, name)
    if refusal is not None:
        raise ConfigError(refusal)
    if isinstance(source, Iterator) and iter(source) is source:
        raise ConfigError(
            f"Split `{name}` is a one-shot iterator ({type(source).__name__}): setup "
            f"draws one batch to learn the fields and every epoch starts it over, "
            f"so it would lose batches. Pass a restartable source: a list of "
            f"batches, a grain.MapDataset, or an object whose __iter__ starts anew."
        )
    try:
        count = len(source)
    except TypeError:
        raise ConfigError(
            f"Split `{name}` ({type(source).__name__}) has no len(). A source must "
            f"count its batches: len() fixes the schedule horizon and the epoch length."
        ) from None
    # A source read by batch_at is not iterated here: a trait source's __iter__
    # may draw a plan, and setup draws one at most.
    if not (_is_grain_map_dataset(source) or reads_by_index(source)):
        try:
            iter(source)
        except TypeError:
            raise ConfigError(
                f"Split `{name}` ({type(source).__name__}) is not iterable. "
                f"{BATCH_HINT}"
            ) from None
    return int(count)


def probe_split(
    name: str, source: Any, *, last: bool = False
) -> tuple[Mapping[str, Any], Mapping[str, Any] | None]:
    """Setup's read of a split: its first batch, and with `last` its last one.

    At most one plan is drawn, as an epoch draws it: a list or a Grain dataset is
    indexed (Grain's epoch 0), a source read by `batch_at` (`reads_by_index`) is
    read over one `begin_epoch()` plan, and any other source goes through
    `__iter__`. The last batch is None when the split has one batch, or when the
    source is only iterable (reading it would take a whole pass).
    """
    source = unwrap_source(source)
    read: Callable[[int], Any] | None = None
    if _is_grain_map_dataset(source) or is_materialized(source):
        read = source.__getitem__
    elif reads_by_index(source):
        read = functools.partial(call_batch_at, source, plan=_plan(source))
    if read is not None:
        first = as_batch(read(0), BATCH_HINT)
    else:
        first = _iterated_first(name, source)
        if has_batch_at(source):  # it keeps its own plan, which iterating just drew
            read = source.batch_at
    count = len(source)  # read after the plan, which may change the batch count
    if not last or count < 2 or read is None:
        return first, None
    return first, as_batch(read(count - 1), BATCH_HINT)


def _iterated_first(name: str, source: Any) -> Mapping[str, Any]:
    for batch in source:
        return as_batch(batch, BATCH_HINT)
    raise ConfigError(
        f"Split `{name}` yielded no batch although len() is {len(source)}."
    )


def _plan(source: Any) -> Any:
    """The source's plan for its next epoch, or None when it keeps its own."""
    begin = getattr(source, "begin_epoch", None)
    return begin() if callable(begin) else None


def first_batch(name: str, source: Any) -> Mapping[str, Any]:
    """One batch of the split, drawn to learn its fields and batch size."""
    return probe_split(name, source)[0]


def epoch_batches(source: Any, epoch: int) -> Iterator[Mapping[str, Any]]:
    """The batches of one epoch (0-based), in the source's order for that epoch."""
    source = unwrap_source(source)
    if _is_grain_map_dataset(source):
        source = GrainSource(source, epoch=epoch)  # reads Grain's epoch `epoch`
    return pass_batches(source)


def pass_batches(source: Any) -> Iterator[Mapping[str, Any]]:
    """One pass off the fan-out: `batch_at` over the plan of the source's next epoch
    where `reads_by_index` says so (the order the fan-out reads), else the source's
    own iteration, which re-plans the epoch itself."""
    if reads_by_index(source):
        plan = _plan(source)
        for index in range(len(source)):
            yield as_batch(call_batch_at(source, index, plan), BATCH_HINT)
    else:
        for batch in source:
            yield as_batch(batch, BATCH_HINT)


def batch_size(batch: Mapping[str, Any], fields: Any = None) -> int:
    """The batch dimension (axis 0) shared by the batch's array fields."""
    sizes = {}
    for name in fields if fields is not None else batch:
        value = batch[name]
        shape = np.shape(value)
        if not shape:
            raise ConfigError(
                f"Batch field `{name}` is a scalar; every field needs the batch "
                f"dimension first, e.g. shape (batch, ...)."
            )
        sizes[name] = shape[0]
    if len(set(sizes.values())) > 1:
        shown = ", ".join(f"{k}: {v}" for k, v in sizes.items())
        raise ConfigError(
            f"Batch fields disagree on the batch size (axis 0): {shown}. The batch "
            f"dimension must come first in every field; a source of single samples "
            f"must be batched first (a grain.MapDataset: `.batch(n)`)."
        )
    if not sizes:
        raise ConfigError("A batch has no fields; cannot infer its size.")
    return int(next(iter(sizes.values())))
