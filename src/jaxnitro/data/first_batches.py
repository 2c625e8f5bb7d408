"""`first_batches`: a split cut to its first `n` batches, keeping how it is read.

A smoke run (`smoke=True`) trains and evaluates on the first few batches of every
split. The cut keeps the split's kind, so the smoke run reads the data the way the
full run will: a list is sliced, a `grain.MapDataset` is sliced by Grain (it stays
a MapDataset and fans out), a `PrefetchIterator` or `NoPrefetch` keeps its settings
around the cut source, and any other source is wrapped in `FirstBatches`, which
passes the fan-out methods through when the source has them.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator
from typing import Any

from .protocol import SplitWrapper, is_grain_map_dataset, is_materialized


class FirstBatches:
    """The first `n` batches of each epoch of `source`.

    `len()` is `min(n, len(source))`; iteration stops after that many batches and
    closes the source's iterator. Every other attribute (`begin_epoch`, `batch_at`,
    `epoch_token`, `release`, the source's own API) is the source's, so a source
    that fans out still does, reading batches `0..n-1` of each epoch's plan.

    Examples:
        >>> cut = FirstBatches([{"x": [1]}, {"x": [2]}, {"x": [3]}], 2)
        >>> len(cut), [b["x"] for b in cut]
        (2, [[1], [2]])
    """

    def __init__(self, source: Any, n: int) -> None:
        self.source = source
        self.n = n

    def __len__(self) -> int:
        return min(self.n, len(self.source))

    def __iter__(self) -> Iterator[Any]:
        iterator = iter(self.source)
        try:
            yield from itertools.islice(iterator, len(self))
        finally:
            close = getattr(iterator, "close", None)
            if callable(close):  # a generator's cleanup runs now
                close()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("source", "n"):
            raise AttributeError(name)
        return getattr(self.source, name)

    def __repr__(self) -> str:
        return f"FirstBatches({self.source!r}, {self.n})"


def first_batches(split: Any, n: int) -> Any:
    """`split` cut to its first `n` batches (see the module), its kind kept."""
    if isinstance(split, SplitWrapper):
        wrapped = copy.copy(split)
        wrapped.source = first_batches(split.source, n)
        return wrapped
    if is_materialized(split):
        return split[:n]
    if is_grain_map_dataset(split):
        return split[: min(n, len(split))]
    return FirstBatches(split, n)
