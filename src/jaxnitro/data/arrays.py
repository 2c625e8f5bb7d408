"""`ArraySource`: in-memory arrays cut into batches, shuffled per (seed, epoch).

The shortest path from arrays already in memory (NumPy, a loaded `.npz`) to a split.
Each epoch's order is a pure function of (seed, epoch), so a resumed run reads the
same batches as an uninterrupted one, and the source has the fan-out trait
(`begin_epoch` / `batch_at`), so several worker threads can cut batches of one epoch.
For data that does not fit in memory, or that needs per-sample transforms, a
`grain.MapDataset` remains the recommended source.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np

from ..errors import ConfigError

PARTIAL_TRAIN_BATCH = (
    "The train split is an ArraySource with drop_last=False whose {samples} samples "
    "leave a partial last batch ({short} samples, the others {size}): a short batch "
    "would compile a second gradient program and weight its samples differently. "
    "Drop it: nx.ArraySource(..., drop_last=True) (drop_last=False is for eval "
    "splits)."
)


class ArrayPlan(NamedTuple):
    """The plan of one epoch: its number (0-based) and the sample order.

    `order` is an int64[N] permutation of the sample indices, or None when the
    source does not shuffle (samples in their stored order).
    """

    epoch: int
    order: np.ndarray | None


class ArraySource:
    """Arrays with a shared leading (sample) dimension, served as batches.

    Args:
        arrays: a dict of field name -> array, each of shape (N, ...) with the same
            N, e.g. `{"img": float32[N, 784], "label": int32[N]}`. A batch is the
            same dict sliced to (B, ...). Fields are flat, as batch fields are: a
            nested dict is refused.
        batch_size: samples per batch, B.
        shuffle: draw a fresh permutation each epoch from (seed, epoch). Keep it on
            for training; turn it off for evaluation.
        drop_last: drop the partial last batch (N % B samples), as a train split
            must; False keeps it, shorter, for an eval split (evaluation pads it
            and slices the padding off before any metric sees it).
        seed: the shuffle seed. None (the default) adopts the run's seed when
            `Nitro` is built, so `Nitro(e, seed=...)` sets the data order too.

    Examples:

        >>> import numpy as np
        >>> source = ArraySource({"x": np.arange(10.0)}, batch_size=4, seed=0)
        >>> len(source), source.dropped_samples
        (2, 2)
        >>> xs = np.concatenate([batch["x"] for batch in source])
        >>> len(xs), len(set(xs.tolist()))  # 8 distinct samples, in a shuffled order
        (8, 8)
        >>> evaluation = ArraySource({"x": np.arange(10.0)}, 4, shuffle=False,
        ...                          drop_last=False)
        >>> [b["x"].tolist() for b in evaluation][-1]
        [8.0, 9.0]
    """

    def __init__(
        self,
        arrays: Mapping[str, Any],
        batch_size: int,
        *,
        shuffle: bool = True,
        drop_last: bool = True,
        seed: int | None = None,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int | np.integer):
            raise ConfigError(
                f"ArraySource `batch_size` must be an int >= 1, got {batch_size!r}."
            )
        if batch_size < 1:
            raise ConfigError(
                f"ArraySource `batch_size` must be an int >= 1, got {batch_size}."
            )
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ConfigError(
                f"ArraySource `seed` must be an int or None (the run's seed), got "
                f"{seed!r}."
            )
        self.arrays = _as_arrays(arrays)
        self.samples = _sample_count(self.arrays)
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        if self.drop_last and self.samples < self.batch_size:
            raise ConfigError(
                f"ArraySource holds {self.samples} samples, fewer than batch_size="
                f"{self.batch_size}, so drop_last=True leaves no batch. Lower "
                f"batch_size, or pass drop_last=False (an eval split)."
            )
        self.seed = seed
        self._seed_given = seed is not None
        self.epoch_token = 0
        self._next_epoch = 0

    def __repr__(self) -> str:
        return (
            f"ArraySource({self.samples} samples, batch_size={self.batch_size}, "
            f"shuffle={self.shuffle}, drop_last={self.drop_last}, seed={self.seed})"
        )

    def __len__(self) -> int:
        full, rest = divmod(self.samples, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    @property
    def dropped_samples(self) -> int:
        """Samples the epoch leaves out: N % batch_size with drop_last, else 0."""
        return self.samples % self.batch_size if self.drop_last else 0

    def check_source_options(self, split_name: str, config: Any) -> None:
        """Refuse, at setup, a train split that would keep a partial last batch."""
        del config
        short = self.samples % self.batch_size
        if split_name == "train" and not self.drop_last and short:
            raise ConfigError(
                PARTIAL_TRAIN_BATCH.format(
                    samples=self.samples, size=self.batch_size, short=short
                )
            )

    def set_seed(self, seed: int) -> None:
        """Adopt the run's seed (setup calls it), unless a seed was passed."""
        if not self._seed_given:
            self.seed = int(seed)

    def set_epoch(self, epoch: int) -> None:
        """Make the next `begin_epoch()` plan `epoch` (0-based), e.g. on resume."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ConfigError(f"`epoch` must be an int >= 0, got {epoch!r}.")
        self._next_epoch = epoch

    def plan_for(self, epoch: int) -> ArrayPlan:
        """The plan of `epoch`: its permutation, drawn from (seed, epoch)."""
        if not self.shuffle:
            return ArrayPlan(epoch, None)
        seed = 0 if self.seed is None else self.seed
        rng = np.random.default_rng([seed % 2**32, epoch])
        return ArrayPlan(epoch, rng.permutation(self.samples))

    def begin_epoch(self) -> ArrayPlan:
        """Plan the next epoch and advance the epoch counter by one."""
        plan = self.plan_for(self._next_epoch)
        self._next_epoch += 1
        self.epoch_token += 1
        return plan

    def batch_at(self, i: int, plan: ArrayPlan | None = None) -> dict[str, Any]:
        """Batch `i` (in `range(len(self))`) of the plan's epoch; epoch 0 without
        one. Thread-safe: it reads the arrays and the plan only."""
        if not 0 <= i < len(self):
            raise IndexError(f"batch {i} out of range for {len(self)} batches")
        if plan is None:
            plan = self.plan_for(0)
        start = i * self.batch_size
        stop = min(start + self.batch_size, self.samples)
        rows: Any = slice(start, stop) if plan.order is None else plan.order[start:stop]
        return {name: value[rows] for name, value in self.arrays.items()}

    def __iter__(self) -> Iterator[dict[str, Any]]:
        plan = self.begin_epoch()
        return (self.batch_at(i, plan) for i in range(len(self)))


def _as_arrays(arrays: Any) -> dict[str, Any]:
    if not isinstance(arrays, Mapping) or not arrays:
        raise ConfigError(
            f"ArraySource takes a non-empty dict of field name -> array, e.g. "
            f"ArraySource({{'img': x, 'label': y}}, batch_size=64); got "
            f"{type(arrays).__name__}."
        )
    fields = {}
    for name, value in arrays.items():
        if isinstance(value, Mapping):
            raise ConfigError(
                f"ArraySource field `{name}` is a {type(value).__name__}; batch "
                f"fields are flat, one array each. Give each array its own field, "
                f"e.g. {{'{name}_x': ..., '{name}_y': ...}}."
            )
        fields[str(name)] = np.asarray(value)
    return fields


def _sample_count(arrays: Mapping[str, np.ndarray]) -> int:
    sizes: dict[str, int] = {}
    for name, value in arrays.items():
        if not value.shape:
            raise ConfigError(
                f"ArraySource field `{name}` is a scalar; every array needs the "
                f"sample dimension first, shape (N, ...)."
            )
        sizes[name] = int(value.shape[0])
    if len(set(sizes.values())) > 1:
        shown = ", ".join(f"{k}: {v}" for k, v in sizes.items())
        raise ConfigError(
            f"ArraySource arrays disagree on the sample count (axis 0): {shown}. "
            f"Every array must hold the same N samples along its first axis."
        )
    if not sizes:
        raise ConfigError("ArraySource was given no arrays.")
    return next(iter(sizes.values()))
