"""A loader's records as engine splits: the train stream in cadence blocks, eval lists.

The train split is an index-addressable source (`begin_epoch` / `batch_at`, the
engine's fan-out trait). Its records form one endless stream: pass `k` over the
records is a permutation seeded by the run seed and `k`, and stream position `p`
is record `perm_k[p % n]` with `k = p // n`. Engine epoch `e` holds the batches of
cadence block `e` (see `cadence.CadencePlan`), so its records are a fixed slice of
the stream: any worker count, and a resume at epoch `e`, read the same records.
A curriculum stage may switch the loader between blocks (`TrainBlocks.use`): the
next blocks read the same stream positions of that loader's stream.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from .records import Records


class RecordStream:
    """The endless shuffled stream of record rows of `records`, seeded by `seed`."""

    def __init__(self, records: Records, seed: int, *, shuffle: bool = True) -> None:
        self.records = records
        self.seed = seed
        self.shuffle = shuffle
        self._orders: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()

    def _order(self, k: int) -> np.ndarray:
        with self._lock:
            order = self._orders.get(k)
            if order is None:
                n = len(self.records)
                order = (
                    np.random.default_rng((self.seed, k)).permutation(n)
                    if self.shuffle
                    else np.arange(n)
                )
                if len(self._orders) > 8:  # only the passes in flight are needed
                    self._orders.pop(min(self._orders))
                self._orders[k] = order
            return order

    def rows(self, start: int, count: int) -> np.ndarray:
        """The record rows at stream positions `start .. start + count - 1`."""
        n = len(self.records)
        positions = np.arange(start, start + count)
        passes = positions // n
        rows = np.empty(count, np.int64)
        for k in np.unique(passes).tolist():
            here = passes == k
            rows[here] = self._order(k)[positions[here] % n]
        return rows

    def batch(self, start: int, count: int) -> dict[str, np.ndarray]:
        """The batch of `count` records from position `start`, bad records refused."""
        rows = self.rows(start, count)
        self.records.check_rows(rows)
        return {name: array[rows] for name, array in self.records.arrays.items()}


class TrainBlocks:
    """The train split: engine epoch `e` is cadence block `e`'s batches.

    `blocks[e]` counts the batches (microbatches, not steps) of block `e`; the
    last block may be shorter. `len()` follows the epoch `begin_epoch` planned.
    """

    def __init__(
        self, stream: RecordStream, batch_size: int, blocks: tuple[int, ...]
    ) -> None:
        self.stream = stream
        self.batch_size = batch_size
        self.blocks = blocks
        self.starts = tuple(int(s) for s in np.cumsum((0, *blocks[:-1])))
        self.epoch_token = 0
        self._epoch = 0
        self._current = 0
        self._planned: tuple[int, np.ndarray, Records] | None = None

    def use(self, stream: RecordStream) -> None:
        """Read the blocks planned from now on from `stream` (a stage's loader)."""
        self.stream = stream

    def __len__(self) -> int:
        return self.blocks[min(self._current, len(self.blocks) - 1)]

    def set_epoch(self, epoch: int) -> None:
        """Position the next `begin_epoch` at the 0-based `epoch` (a resume)."""
        self._epoch = epoch

    def epoch_rows(self, epoch: int) -> np.ndarray:
        """The record rows of every batch of `epoch`, in order ([batches * size])."""
        block = min(epoch, len(self.blocks) - 1)
        first = self.starts[block] + max(0, epoch - block) * self.blocks[-1]
        size = self.batch_size
        return self.stream.rows(first * size, self.blocks[block] * size)

    def begin_epoch(self) -> tuple[int, np.ndarray, Records]:
        """Plan the next epoch: its index, its records' rows (computed once, so a
        batch is one gather per field) and the records they index."""
        epoch = self._epoch
        self._epoch += 1
        self._current = epoch
        self.epoch_token += 1
        self._planned = (epoch, self.epoch_rows(epoch), self.stream.records)
        return self._planned

    def batch_at(self, i: int, plan: Any = None) -> dict[str, np.ndarray]:
        """Batch `i` of the epoch `plan`: what `begin_epoch` returned, an epoch
        index, or None for the last planned epoch."""
        if plan is None and self._planned is not None:
            plan = self._planned
        elif plan is None or isinstance(plan, int):
            epoch = self._current if plan is None else plan
            plan = (epoch, self.epoch_rows(epoch), self.stream.records)
        _, all_rows, records = plan
        rows = all_rows[i * self.batch_size : (i + 1) * self.batch_size]
        records.check_rows(rows)
        return {name: array[rows] for name, array in records.arrays.items()}

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        """The next epoch's batches, read inline (`NoPrefetch`): one gather per
        field for the whole block, then each batch is a view of it."""
        _, rows, records = self.begin_epoch()
        return self._views(rows, records)

    def _views(
        self, rows: np.ndarray, records: Records
    ) -> Iterator[dict[str, np.ndarray]]:
        gathered = {name: array[rows] for name, array in records.arrays.items()}
        size = self.batch_size
        for start in range(0, len(rows), size):
            records.check_rows(rows[start : start + size])
            yield {
                name: array[start : start + size] for name, array in gathered.items()
            }


def eval_batches(
    records: Records, batch_size: int, limit: int | None
) -> list[dict[str, np.ndarray]]:
    """An evaluation split: the records in file order, at most `limit` batches.

    Raises:
        RunfileError: a bad record the split holds (E-LOAD-009/010/011).
    """
    n = len(records)
    if limit is not None:
        n = min(n, limit * batch_size)
    rows = np.arange(n)
    records.check_rows(rows)
    return [
        {
            name: array[start : start + batch_size]
            for name, array in records.arrays.items()
        }
        for start in range(0, n, batch_size)
    ]


def train_split(blocks: TrainBlocks) -> Any:
    """The train split as the engine gets it: inline on a CPU backend, else through
    the engine's prefetch stream.

    A batch is a view of one gather per field a block (microseconds), so on a CPU
    backend worker threads would only add hand-offs and compete with the step for
    the cores: the run file reads its batches on the training thread, as the engine
    reads the list of built batches a hand-written experiment gives it
    (`NoPrefetch`; docs/runfile.md, "Speed", has the measurements). On an
    accelerator the stream's threads stage the next batch on the device while the
    current step runs.
    """
    import jax

    import jaxnitro as nx

    return nx.data.NoPrefetch(blocks) if jax.default_backend() == "cpu" else blocks
