"""Evaluation outputs across processes: every process's rows, on every host.

In a run across processes each process feeds its own rows of an eval batch, padded
to its part of the eval width, and the forward program's outputs are split over
every process's devices: no host can read them. These helpers bring them back:
the chunk's real counts first (one small collective), then each output leaf and
each numeric host field gathered whole (`process_allgather`) and cut to the real
rows, rank by rank. Every process then holds the same global batch, in rank order,
so the metrics, the eval loss, and what early stopping and checkpoint ranking read
from them are the same on every rank.

Gathering the outputs costs one all-gather per output leaf per chunk; reducing
the metrics inside a program would move less, but the metrics hook runs on the
host by default and sees the whole batch, so the outputs travel.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import numpy as np

from ..data.padding import pad_batch
from ..data.transfer import is_numeric_dtype
from ..errors import ConfigError

UNEVEN_CHUNKS = (
    "Batch {index} of split `{split}`: the {world} processes cut it differently "
    "({shown}). Every process must feed the same number of eval batches, each no "
    "wider than the first (its part of the eval width, {width} rows), so that "
    "the processes run each chunk together. Shard every eval split evenly by rank "
    "(e.g. dist.shard(array, batch_size, drop_last=False))."
)
EMPTY_PART = (
    "Batch {index} of split `{split}`: rank {rank} feeds 0 of its rows (counts by "
    "rank: {counts}); every process must feed at least one row of every eval batch, "
    "since its padding repeats its last row. Shard the split so that each process "
    "gets a part of the last batch (a last batch of at least {world} rows)."
)


def _allgather(value: Any, tiled: bool) -> np.ndarray:
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(value, tiled=tiled))


class ChunkCounts(NamedTuple):
    """What the processes said of their current eval chunk, the same on each."""

    counts: np.ndarray
    """Every process's real rows, rank by rank."""
    stop: bool
    """Whether any process asked to stop before this chunk (then every one does)."""


def chunk_counts(
    n_real: int,
    ends_batch: bool,
    *,
    split: str,
    index: int,
    width: int,
    stop: bool = False,
) -> ChunkCounts:
    """Every process's real count of its current eval chunk, rank by rank, and
    whether any process asks to `stop` before it (a collective: every process
    calls it for each chunk, so a stop one rank requested ends every rank's pass
    at the same chunk).

    Raises:
        ConfigError: on every process alike, when the processes disagree on where
            the source batch ends, or one feeds no rows.
    """
    mine = np.array([n_real, int(ends_batch), int(stop)], np.int64)
    every = _allgather(mine, tiled=False)
    if every[:, 2].any():
        return ChunkCounts(every[:, 0], True)
    counts, ends = every[:, 0], every[:, 1]
    world = len(counts)
    if not (ends == ends[0]).all():
        shown = ", ".join(
            f"rank {r}: {int(c)} rows, {'last' if e else 'not last'} chunk"
            for r, (c, e) in enumerate(zip(counts, ends, strict=True))
        )
        raise ConfigError(
            UNEVEN_CHUNKS.format(
                index=index, split=split, world=world, shown=shown, width=width
            )
        )
    if (counts == 0).any():
        raise ConfigError(
            EMPTY_PART.format(
                index=index,
                split=split,
                rank=int(np.argmin(counts)),
                counts=counts.tolist(),
                world=world,
            )
        )
    return ChunkCounts(counts, False)


def _real_rows(whole: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The real rows of `whole` (every process's part of `width` rows, padded):
    rank 0's first counts[0], then rank 1's first counts[1], ..."""
    width = whole.shape[0] // len(counts)
    return np.concatenate(
        [whole[r * width : r * width + int(n)] for r, n in enumerate(counts)]
    )


def gather_outputs(outputs: Any, counts: np.ndarray) -> Any:
    """The forward outputs (split over every process's devices, each process's part
    padded to the same width) as host arrays of the real rows, on every process."""
    return jax.tree.map(
        lambda leaf: _real_rows(_allgather(leaf, tiled=True), counts), outputs
    )


def gather_fields(
    host: Mapping[str, Any], counts: np.ndarray, width: int
) -> dict[str, np.ndarray]:
    """The chunk's numeric host fields (this process's `counts[rank]` rows) joined
    with every other process's, rank by rank, on every process. A field that is
    not numeric cannot cross the processes and is left out."""
    numeric = {
        k: np.asarray(v)
        for k, v in host.items()
        if is_numeric_dtype(np.asarray(v).dtype) and np.ndim(v) > 0
    }
    padded = pad_batch(numeric, width)
    return {k: _real_rows(_allgather(v, tiled=True), counts) for k, v in padded.items()}


def gather_whole(outputs: Any) -> Any:
    """Outputs split over every process's devices, whole on every process's host."""
    return jax.tree.map(lambda leaf: _allgather(leaf, tiled=True), outputs)


def _split_over_processes(leaf: Any) -> bool:
    return (
        isinstance(leaf, jax.Array)
        and not leaf.is_fully_addressable
        and not leaf.is_fully_replicated
    )


def gather_split_leaves(tree: Any) -> Any:
    """`tree` with every leaf split over several processes' devices (an fsdp
    training state across processes) gathered whole onto every host; every other
    leaf as it is. A collective for each split leaf: every process calls it with
    the same tree, in the same order, since the leaves and their shardings are
    alike on every process."""
    if jax.process_count() == 1:
        return tree
    return jax.tree.map(_whole_if_split, tree)


def _whole_if_split(leaf: Any) -> Any:
    return _allgather(leaf, tiled=True) if _split_over_processes(leaf) else leaf
