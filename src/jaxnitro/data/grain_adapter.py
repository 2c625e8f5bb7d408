"""Grain datasets as sources: the built-in fan-out adapter and the option checks.

A `grain.MapDataset` is random access, and Grain defines what index `e * len(ds) + i`
means: element `i` of epoch `e`. Its `shuffle` draws epoch `e`'s permutation from
`seed + e`, its `random_map` seeds each element from the global index, and its `batch`
batches each epoch separately. The adapter therefore plans an epoch as nothing more
than its number, and `batch_at(i, plan)` reads `ds[plan.epoch * len(ds) + i]`: the
batching, shuffling and augmentation are Grain's own, each epoch's order is a pure
function of (seed, epoch), a resume positioned with `set_epoch` reproduces the data
order, and any number of worker threads read the same batches.

    >>> import grain
    >>> ds = grain.MapDataset.range(6).shuffle(seed=0).batch(3)
    >>> source = GrainSource(ds)
    >>> plan = source.begin_epoch()
    >>> plan
    GrainPlan(epoch=0)
    >>> [source.batch_at(i, plan).tolist() for i in range(len(source))] == [
    ...     ds[i].tolist() for i in range(2)]
    True
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any, NamedTuple

from ..errors import ConfigError
from .protocol import is_grain_map_dataset


class GrainPlan(NamedTuple):
    """The plan of one epoch of a Grain dataset: the epoch's number (0-based)."""

    epoch: int


class GrainSource:
    """A `grain.MapDataset` with the fan-out trait; epoch `e` reads Grain's epoch `e`.

    Args:
        dataset: a `grain.MapDataset` whose elements are batch dicts (batch first).
        epoch: the epoch (0-based) the next `begin_epoch()` plans.
    """

    def __init__(self, dataset: Any, *, epoch: int = 0) -> None:
        if not is_grain_map_dataset(dataset):
            raise ConfigError(
                f"GrainSource wraps a grain.MapDataset, got {type(dataset).__name__}."
            )
        self.dataset = dataset
        self.epoch_token = 0
        self._next_epoch = 0
        self.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.dataset)

    def __repr__(self) -> str:
        return f"GrainSource({self.dataset}, next_epoch={self._next_epoch})"

    def set_epoch(self, epoch: int) -> None:
        """Make the next `begin_epoch()` plan `epoch` (0-based), e.g. on resume."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ConfigError(f"`epoch` must be an int >= 0, got {epoch!r}.")
        self._next_epoch = epoch

    def begin_epoch(self) -> GrainPlan:
        """Plan the next epoch: its number; the shuffle follows from (seed, epoch)."""
        plan = GrainPlan(self._next_epoch)
        self._next_epoch += 1
        self.epoch_token += 1
        return plan

    def batch_at(self, i: int, plan: GrainPlan | None = None) -> Any:
        """Batch `i` (a batch index in `range(len(self))`) of the plan's epoch.

        Without a plan, epoch 0. Thread-safe: Grain's map datasets are read
        concurrently by Grain's own prefetch threads.
        """
        length = len(self.dataset)
        if not 0 <= i < length:
            raise IndexError(
                f"batch index {i} is outside range({length}): `i` counts batches "
                f"of one epoch, not samples."
            )
        epoch = 0 if plan is None else plan.epoch
        return self.dataset[epoch * length + i]

    def __iter__(self) -> Iterator[Any]:
        plan = self.begin_epoch()
        for i in range(len(self)):
            yield self.batch_at(i, plan)


def as_indexed(source: Any) -> Any:
    """The source the pipeline reads: a Grain `MapDataset` adapted, else `source`."""
    if is_grain_map_dataset(source):
        return GrainSource(source)
    return source


def _lineage(dataset: Any) -> Iterator[Any]:
    """`dataset` and every dataset it was built from (Grain's `parents`)."""
    stack = [dataset]
    seen: set[int] = set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        yield node
        stack.extend(getattr(node, "parents", ()) or ())


def _class_names(source: Any) -> set[str]:
    return {type(node).__name__ for node in _lineage(source)}


def _grain_kind(source: Any) -> str | None:
    """'map', 'iter', 'iterator' or 'loader' for a Grain object, else None."""
    for cls in type(source).__mro__:
        if not cls.__module__.startswith("grain"):
            continue
        kind = {
            "MapDataset": "map",
            "IterDataset": "iter",
            "DatasetIterator": "iterator",
            "DataLoader": "loader",
        }.get(cls.__name__)
        if kind is not None:
            return kind
    return None


_ITER_DATASET = (
    "Split `{name}` is a grain.IterDataset ({kind}), which cannot be addressed by "
    "index and has no len(). Pass the grain.MapDataset from before "
    "`.to_iter_dataset()` / `.mp_prefetch()` (e.g. `ds.shuffle(seed=s).map(f)"
    ".batch(b)`): the framework prefetches it with its own worker threads and "
    "transfer thread, and each epoch's shuffle follows from (seed, epoch). Grain's "
    "prefetch threads or worker processes would be a second, uncoordinated fan-out, "
    "and on few cores its processes are slower than threads."
)
_ITERATOR = (
    "Split `{name}` is a Grain iterator ({kind}), which is one-shot: setup draws a "
    "batch from it and every epoch would start where the last stopped. Pass the "
    "grain.MapDataset itself."
)
_LOADER = (
    "Split `{name}` is a grain.DataLoader, which runs its own sampler and worker "
    "processes and has no len(). Build a grain.MapDataset instead, e.g. "
    "`grain.MapDataset.source(data).shuffle(seed=s).map(f).batch(b)`; the framework "
    "prefetches it with threads (set `PrefetchIterator(ds, workers=...)`)."
)
_FILTER = (
    "Split `{name}` is a grain.MapDataset with `.filter()`, which leaves holes (None) "
    "that len() still counts, so the number of batches per epoch is unknown. Filter "
    "the samples before building the MapDataset, or drop the filter."
)
_REPEAT = (
    "Split `{name}` is a grain.MapDataset built on `.repeat()` with no epoch count "
    "({node} in its lineage), so len() is {length} and an epoch never ends. The "
    "framework runs max_epochs passes itself and plans each from (seed, epoch): "
    "drop the `.repeat()`."
)


def grain_type_refusal(source: Any, name: str) -> str | None:
    """Why a Grain object that is not a `MapDataset` cannot be a split, else None.

    These objects are one-shot or unsized, so `check_split` refuses them anyway;
    this names the Grain fix.
    """
    kind = _grain_kind(source)
    if kind == "loader":
        return _LOADER.format(name=name)
    if kind == "iterator":
        return _ITERATOR.format(name=name, kind=type(source).__name__)
    if kind == "iter":
        return _ITER_DATASET.format(name=name, kind=type(source).__name__)
    return None


def _is_endless(dataset: Any) -> bool:
    try:
        return len(dataset) >= sys.maxsize
    except TypeError:
        return False


def _endless(dataset: Any) -> Any:
    """The dataset in `dataset`'s lineage that made it endless (an epoch-less
    `.repeat()`: endless, its parents not), or None. A batch above it divides the
    length, so it is looked for where it was made, whatever follows it."""
    for node in _lineage(dataset):
        parents = getattr(node, "parents", ()) or ()
        if _is_endless(node) and not any(_is_endless(p) for p in parents):
            return node
    return None


def grain_refusal(source: Any, name: str) -> str | None:
    """The reason a Grain object cannot be a split, or None (also for non-Grain).

    An endless `.repeat()` anywhere in a `MapDataset`'s lineage is named first: a
    batch above it gives the split a finite-looking len(), and the partial-batch or
    filter refusals would point at the wrong fix.

    >>> import grain
    >>> ds = grain.MapDataset.range(8).repeat().batch(2)
    >>> grain_refusal(ds, "train").split(" (")[0]
    'Split `train` is a grain.MapDataset built on `.repeat()` with no epoch count'
    >>> grain_refusal([{"x": [1.0]}], "train") is None
    True
    """
    reason = grain_type_refusal(source, name)
    if reason is not None or _grain_kind(source) != "map":
        return reason
    endless = _endless(source)
    if endless is not None:
        return _REPEAT.format(name=name, node=endless, length=len(source))
    if "FilterMapDataset" in _class_names(source):
        return _FILTER.format(name=name)
    return None
