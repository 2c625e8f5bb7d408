"""The data source protocol, as the training loop and evaluation consume it.

A split is any sized iterable of batches (`len()` counts batches), each batch a dict of
arrays with the batch dimension first. A source must be restartable: setup draws one
batch to learn the fields, and every epoch iterates it from the start, so a one-shot
iterator is refused. Two optional methods make a source index-addressable:
`begin_epoch() -> plan` and `batch_at(i, plan)`. A `grain.MapDataset` is indexed
directly, epoch `e` reading `ds[e * len(ds) + i]`, which gives a shuffled dataset a
fresh permutation each epoch that a resume reproduces.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..routing import as_batch
from .grain_adapter import GrainSource, grain_type_refusal
from .protocol import BATCH_HINT, call_batch_at, unwrap_source
from .protocol import is_grain_map_dataset as _is_grain_map_dataset


def has_batch_at(source: Any) -> bool:
    """Whether the source implements the index-addressable trait."""
    return callable(getattr(unwrap_source(source), "batch_at", None))


def check_split(name: str, source: Any) -> int:
    """Validate a split's source and return its batch count.

    A `PrefetchIterator` or `NoPrefetch` is looked through; a Grain object that
    cannot be a split (an IterDataset, an iterator, a DataLoader) is refused naming
    the fix.
    """
    source = unwrap_source(source)
    refusal = grain_type_refusal(source, name)
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
    if not (_is_grain_map_dataset(source) or has_batch_at(source)):
        try:
            iter(source)
        except TypeError:
            raise ConfigError(
                f"Split `{name}` ({type(source).__name__}) is not iterable. "
                f"{BATCH_HINT}"
            ) from None
    return int(count)


def batch_at_index(source: Any, index: int) -> Mapping[str, Any] | None:
    """Batch `index` of epoch 0 by random access, or None for a sequential source."""
    source = unwrap_source(source)
    if has_batch_at(source):
        return as_batch(call_batch_at(source, index, _plan(source)), BATCH_HINT)
    if _is_grain_map_dataset(source) or isinstance(source, list | tuple):
        return as_batch(source[index], BATCH_HINT)
    return None


def _plan(source: Any) -> Any:
    """The source's plan for its next epoch, or None when it keeps its own."""
    begin = getattr(source, "begin_epoch", None)
    return begin() if callable(begin) else None


def first_batch(name: str, source: Any) -> Mapping[str, Any]:
    """One batch of the split, drawn to learn its fields and batch size."""
    found = batch_at_index(source, 0)
    if found is not None:
        return found
    for batch in source:
        return as_batch(batch, BATCH_HINT)
    raise ConfigError(
        f"Split `{name}` yielded no batch although len() is {len(source)}."
    )


def epoch_batches(source: Any, epoch: int) -> Iterator[Mapping[str, Any]]:
    """The batches of one epoch (0-based), in the source's order for that epoch."""
    source = unwrap_source(source)
    if _is_grain_map_dataset(source):
        source = GrainSource(source, epoch=epoch)  # reads Grain's epoch `epoch`
    return pass_batches(source)


def pass_batches(source: Any) -> Iterator[Mapping[str, Any]]:
    """One pass: `batch_at` over the plan of the source's next epoch when it has the
    trait (the order the fan-out reads), else the source's own iteration."""
    if has_batch_at(source):
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
            f"dimension must come first in every field."
        )
    if not sizes:
        raise ConfigError("A batch has no fields; cannot infer its size.")
    return int(next(iter(sizes.values())))
