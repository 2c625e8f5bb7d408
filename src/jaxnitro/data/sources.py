"""The data source protocol, as the training loop and evaluation consume it.

A split is any sized iterable of batches (`len()` counts batches), each batch a dict of
arrays with the batch dimension first. A source must be restartable: setup draws one
batch to learn the fields, and every epoch iterates it from the start, so a one-shot
iterator is refused (and an epoch that runs short, at its end: loop/steps.py). Two
optional methods make a source index-addressable: `begin_epoch() -> plan` and
`batch_at(i, plan)`. With both, the fan-out reads `batch_at` over one plan per epoch
and never calls `__iter__`; every other reader (one producer, `NoPrefetch`, setup's
probe) iterates the source, which re-plans in its own `__iter__`, and never calls
`begin_epoch` (see `reads_by_index`): a source that counts its plans sees N + 1 over
N epochs. Only a source without `__iter__` is read by `batch_at` off the fan-out. A
`grain.MapDataset` is indexed directly, epoch `e` reading `ds[e * len(ds) + i]`,
which gives a shuffled dataset a fresh permutation each epoch that a resume
reproduces.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..experiment.routing import as_batch
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

    Only a source with `batch_at` and no `__iter__`, which nothing else could read:
    it is read over one plan (its `begin_epoch()`'s, where it has one). Any source
    with `__iter__` is iterated, trait or not, so it plans its epoch itself.
    """
    return has_batch_at(source) and not has_iter(source)


def check_split(name: str, source: Any) -> int:
    """Validate a split's source and return its batch count.

    A `PrefetchIterator` or `NoPrefetch` is looked through; a Grain object that
    cannot be a split (an IterDataset, an iterator, a DataLoader, a MapDataset with a
    filter or an endless repeat) is refused naming the fix.
    """
    source = unwrap_source(source)
    if isinstance(source, Mapping):  # iterating a dict yields its keys, not batches
        raise ConfigError(whole_arrays_message(name, source))
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
    # A source that defines __iter__ (or batch_at) is not iterated here: its
    # __iter__ may draw a plan, and setup draws one at most, in the probe.
    if not (_is_grain_map_dataset(source) or has_iter(source) or has_batch_at(source)):
        try:
            iter(source)
        except TypeError:
            raise ConfigError(
                f"Split `{name}` ({type(source).__name__}) is not iterable. "
                f"{BATCH_HINT}"
            ) from None
    return int(count)


def whole_arrays_message(name: str, split: Mapping[Any, Any]) -> str:
    """The refusal of a split given as a dict of whole arrays, not of batches."""
    fields = ", ".join(
        f"{key}: {_shape_and_dtype(value)}" for key, value in list(split.items())[:6]
    )
    # An eval split keeps its order and every sample; a train split shuffles and
    # drops the partial batch, which would compile a second gradient program.
    flags = "True" if name == "train" else "False"
    return (
        f"Split `{name}` is a dict of whole arrays ({fields or 'empty'}), not a "
        f"sequence of batches: iterating a dict yields its keys, so each batch would "
        f"be a string. A split yields batch dicts such as {{'img': array, 'label': "
        f"array}}. Batch the arrays with nx.ArraySource(arrays, batch_size=32, "
        f"shuffle={flags}, drop_last={flags}), where `arrays` is this dict."
    )


def _shape_and_dtype(value: Any) -> str:
    shape = getattr(value, "shape", None)
    if shape is None:
        return type(value).__name__
    return f"{tuple(shape)} {getattr(value, 'dtype', '')}".rstrip()


def bind_run_seed(data: Mapping[str, Any], seed: int) -> None:
    """Offer the run's seed to every split's source that takes one (`set_seed`,
    detected by name, as `ArraySource` defines it), so `Nitro(e, seed=...)` sets
    the data order too. A source given its own seed keeps it."""
    for split in data.values():
        adopt = getattr(unwrap_source(split), "set_seed", None)
        if callable(adopt):
            adopt(seed)


def check_source_options(source: Any, name: str, cfg: Any) -> None:
    """Refuse source settings the resolved pipeline cannot honour, naming the fix.

    Called at setup for every split (the `inline` ones included) with the unwrapped
    source and the split's resolved `prefetch_config`. The built-in checks refuse a
    Grain `IterDataset` (after `.to_iter_dataset()` or `.mp_prefetch()`), a Grain
    iterator, a `grain.DataLoader`, and a `MapDataset` with an endless `repeat()` or
    a `filter`. Then a source that defines its own `check_source_options(name, cfg)`
    method (detected by name, as `release()` is) is asked too: it raises or warns
    about its own settings, e.g. an option its `__iter__` implements, which the
    fan-out never calls.

    Examples:
        >>> check_source_options([{"x": [1.0]}], "train", None)
    """
    source = unwrap_source(source)
    if not is_materialized(source):
        reason = grain_refusal(source, name)
        if reason is not None:
            raise ConfigError(reason)
    own = getattr(source, "check_source_options", None)
    if callable(own):
        own(name, cfg)


def probe_split(
    name: str, source: Any, *, last: bool = False
) -> tuple[Mapping[str, Any], Mapping[str, Any] | None]:
    """Setup's read of a split: its first batch, and with `last` its last one.

    As an epoch off the fan-out reads it, drawing at most one plan: a list or a
    Grain dataset is indexed (Grain's epoch 0), a source with `__iter__` is
    iterated (its `__iter__` plans; `begin_epoch` is never called directly), and
    only a source without `__iter__` is read by `batch_at` (`reads_by_index`). The
    last batch is None when the split has one batch, or when reading it would take
    another plan or a whole pass: an iterated source is read by `batch_at` only
    when it lacks `begin_epoch`, so it keeps the plan its `__iter__` just drew.
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
        if has_batch_at(source) and not fanout_capable(source):
            read = source.batch_at  # it keeps the plan iterating just drew
    count = len(source)  # read after the plan, which may change the batch count
    if not last or count < 2 or read is None:
        return first, None
    return first, as_batch(read(count - 1), BATCH_HINT)


def _iterated_first(name: str, source: Any) -> Mapping[str, Any]:
    iterator = iter(source)
    try:
        for batch in iterator:
            return as_batch(batch, BATCH_HINT)
    finally:
        close = getattr(iterator, "close", None)
        if callable(close):  # a generator's cleanup runs now, not when collected
            close()
    raise ConfigError(
        f"Split `{name}` yielded no batch although len() is {len(source)}."
    )


def _plan(source: Any) -> Any:
    """The plan of the next epoch of a source read by `batch_at` (no `__iter__`),
    or None when it keeps its own (it has no `begin_epoch`)."""
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
    """One pass off the fan-out: the source's own iteration, which plans the epoch
    itself; `batch_at` over one plan only for a source without `__iter__`
    (`reads_by_index`)."""
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
