"""The data source protocol: what a split must be, and the optional fan-out trait.

A split is any sized, restartable iterable of batches: `len(source)` counts BATCHES,
and every `iter(source)` starts the epoch over (setup draws one batch to learn the
fields, then each epoch iterates from the start, so a one-shot iterator is refused).
Each batch is a dict of host arrays with the batch dimension FIRST, e.g.
`{"img": float32[B, 784], "label": float32[B, 10]}`.

Optional methods, each detected by name:

- `begin_epoch() -> plan` and `batch_at(i, plan=None) -> batch` (the fan-out trait):
  with both, several worker threads build batches of one epoch concurrently. The
  fan-out calls `begin_epoch()` once per pass, before requesting any batch, then
  `batch_at(i, plan)` for each BATCH index `i` in `range(len(source))` (not a sample
  offset); `len()` is read after `begin_epoch()` returns, so a plan may change the
  batch count (with `accum`, it must stay a multiple of it). A source that stores
  its own plan returns None and is called as `batch_at(i)`. `batch_at` must be
  thread-safe and depend only on `i` and the plan. The fan-out never calls
  `__iter__`, and the other paths (one producer, `NoPrefetch`, setup's probe) never
  call `begin_epoch()`: they iterate, so `__iter__` should call `begin_epoch()`.
- `epoch_token`: an int the source increments on each `begin_epoch()`; the fan-out
  checks that one call advanced it by exactly one.
- `check_source_options(split_name, config) -> None`: refuse (raise) or warn about
  the source's own settings that the split's resolved pipeline cannot honour.
  Setup calls it once per split, `NoPrefetch` ones included, after the built-in
  checks, with the split's name and its resolved `PrefetchConfig` (`config.path`
  says whether `__iter__` runs at all: the fan-out never calls it).
- `set_epoch(epoch)`: position the next `begin_epoch()` at a 0-based epoch, so a
  resumed run reproduces the data order (the Grain adapter implements it).
- `set_seed(seed)`: adopt the run's seed; setup calls it once per split, after
  `build_data`, so `Nitro(e, seed=...)` sets the data order (`ArraySource` uses it
  unless it was given its own seed).
- `release()`: close what the source holds open (a file, a client); it must tolerate
  a second call.

A `grain.MapDataset` gets the trait from the built-in adapter (`grain_adapter`), and a
list of prebuilt batches needs none: producing one is a pointer load.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..errors import ConfigError, NitroWarning
from . import stragglers

Batch = Mapping[str, Any]
"""A batch: field name -> host array with the batch dimension first, shape (B, ...)."""
BATCH_HINT = "Each split must yield dicts such as {'img': array, 'label': array}."
"""The fix named when a split yields something other than a batch dict."""


@runtime_checkable
class BatchSource(Protocol):
    """A split: a sized, restartable iterable of batch dicts; `len()` counts batches."""

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Batch]: ...


@runtime_checkable
class IndexedSource(BatchSource, Protocol):
    """A source with the fan-out trait: batch `i` of an epoch on demand.

    Examples:
        A loader over arrays `x` (float32[N, ...]) whose plan is a permutation:

        >>> import numpy as np
        >>> class Loader:
        ...     def __init__(self, x, batch_size, seed):
        ...         self.x, self.bs, self.seed = x, batch_size, seed
        ...         self.epoch_token = 0
        ...     def __len__(self):
        ...         return len(self.x) // self.bs
        ...     def begin_epoch(self):
        ...         rng = np.random.default_rng((self.seed, self.epoch_token))
        ...         self.epoch_token += 1
        ...         return rng.permutation(len(self.x))
        ...     def batch_at(self, i, plan=None):
        ...         rows = plan[i * self.bs : (i + 1) * self.bs]  # i counts BATCHES
        ...         return {"x": self.x[rows]}
        ...     def __iter__(self):
        ...         plan = self.begin_epoch()
        ...         return (self.batch_at(i, plan) for i in range(len(self)))
        >>> loader = Loader(np.arange(10.0), batch_size=4, seed=0)
        >>> fanout_capable(loader), len(loader)
        (True, 2)
    """

    def begin_epoch(self) -> Any: ...

    def batch_at(self, i: int, plan: Any = None) -> Batch: ...


class SplitWrapper:
    """Base of the per-split settings wrappers (`PrefetchIterator`, `NoPrefetch`).

    A wrapper holds the source and its settings only; `len()` and `iter()` pass
    through to the source, so iterating a wrapped split by hand starts no thread.
    """

    __slots__ = ("_view", "source")

    def __init__(self, source: Any) -> None:
        if isinstance(source, SplitWrapper):
            raise ConfigError(
                f"{type(self).__name__}(...) was given a split that is already "
                f"wrapped in {type(source).__name__}. Wrap the source itself, once."
            )
        self.source = source
        self._view: Any = None

    def __len__(self) -> int:
        return len(self.source)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.source)

    def __getitem__(self, index: Any) -> Any:
        # `nitro.data["test"][i]` keeps working on the wrapped split.
        return self.source[index]

    def __getattr__(self, name: str) -> Any:
        # Only reached for names the wrapper lacks: the source's own API shows through.
        if name.startswith("__") or name in SplitWrapper.__slots__:
            raise AttributeError(name)
        return getattr(self.source, name)


def unwrap_source(split: Any) -> Any:
    """The source inside a `PrefetchIterator` or `NoPrefetch`, else `split` itself."""
    while isinstance(split, SplitWrapper):
        split = split.source
    return split


def is_grain_map_dataset(source: Any) -> bool:
    """Whether `source` is a `grain.MapDataset` (checked without importing grain)."""
    return any(
        cls.__name__ == "MapDataset" and cls.__module__.startswith("grain")
        for cls in type(source).__mro__
    )


def is_materialized(source: Any) -> bool:
    """Whether `source` is a list or tuple of already-built batches."""
    return isinstance(source, list | tuple)


def missing_trait_methods(source: Any) -> tuple[str, ...]:
    """The fan-out trait methods `source` lacks (empty for a capable source)."""
    source = unwrap_source(source)
    if is_grain_map_dataset(source):
        return ()
    return tuple(
        name
        for name in ("begin_epoch", "batch_at")
        if not callable(getattr(source, name, None))
    )


def fanout_capable(source: Any) -> bool:
    """Whether several worker threads can build `source`'s batches.

    True when the source defines both `begin_epoch` and `batch_at`, or is a
    `grain.MapDataset` (the built-in adapter supplies both). A wrapper is looked
    through.

    Examples:
        >>> fanout_capable([{"x": [1.0]}])
        False
    """
    return not missing_trait_methods(source)


def epoch_token(source: Any) -> int | None:
    """The source's epoch counter (an int attribute or method), or None to skip the
    fan-out's check. A NumPy integer counts; a bool does not.

    Examples:
        >>> class Counted:
        ...     epoch_token = np.int64(3)
        >>> epoch_token(Counted()), epoch_token([])
        (3, None)
    """
    token = getattr(unwrap_source(source), "epoch_token", None)
    if callable(token):
        token = token()
    if isinstance(token, bool) or not isinstance(token, int | np.integer):
        return None
    return int(token)


_TOKEN_MESSAGE = (
    "`begin_epoch` of split `{name}` ({kind}) moved epoch_token from {before} to "
    "{after}; one call must advance it by exactly one. {why} Re-plan in "
    "`begin_epoch` and have `__iter__` call it, rather than re-planning in `__iter__`."
)


def begin_epoch_checked(source: Any, name: str) -> Any:
    """Call `source.begin_epoch()` once and check its epoch_token advanced by one."""
    before = epoch_token(source)
    plan = source.begin_epoch()
    after = epoch_token(source)
    if before is not None and after != before + 1:
        why = (
            "It did not advance, so this epoch may reuse the last epoch's plan."
            if after == before
            else "It advanced by more than one, which skips a generation of "
            "epoch-seeded augmentation."
        )
        raise ConfigError(
            _TOKEN_MESSAGE.format(
                name=name,
                kind=type(source).__name__,
                before=before,
                after=after,
                why=why,
            )
        )
    return plan


def call_batch_at(source: Any, index: int, plan: Any) -> Any:
    """`source.batch_at(index, plan)`, or `batch_at(index)` when the plan is None."""
    if plan is None:
        return source.batch_at(index)
    return source.batch_at(index, plan)


def has_release(source: Any) -> bool:
    """Whether the source defines `release()` (a wrapper is looked through)."""
    return callable(getattr(unwrap_source(source), "release", None))


RELEASE_WAIT_SECONDS = 30.0
"""How long a release waits for prefetch workers still reading the source."""


def release_source(source: Any) -> None:
    """Call the source's `release()` if it defines one (a wrapper is looked through),
    once the prefetch workers a closed stream left reading it have finished."""
    if not has_release(source):
        return
    raw = unwrap_source(source)
    stuck = stragglers.join(raw, RELEASE_WAIT_SECONDS)
    if stuck:
        warnings.warn(
            f"Releasing {type(raw).__name__} while prefetch thread(s) "
            f"{', '.join(stuck)} still read it, {RELEASE_WAIT_SECONDS:g} s after "
            f"their stream closed: a batch_at that blocks this long may see its "
            f"source closed under it.",
            NitroWarning,
            stacklevel=3,
        )
    raw.release()


def release_splits(collection: Mapping[str, Any]) -> None:
    """Release every split's source once; a failing one is warned about, not raised.

    A source shared by two splits is released once. Call it once per handle (at the
    first Terminal phase, or from `Nitro.release()`); a source must tolerate a
    second call anyway.
    """
    seen: set[int] = set()
    for name, split in collection.items():
        source = unwrap_source(split)
        if id(source) in seen:
            continue
        seen.add(id(source))
        try:
            release_source(source)
        except Exception as error:
            warnings.warn(
                f"release() of split `{name}` ({type(source).__name__}) raised "
                f"{type(error).__name__}: {error}. The other splits were still "
                f"released; fix the source's release() so a second call is harmless "
                f"too.",
                NitroWarning,
                stacklevel=2,
            )


def dropped_samples(source: Any) -> int | None:
    """How many samples the split's drop-last discards each epoch, when it can say.

    A source may declare it (an int `dropped_samples` attribute or method); a list of
    built batches drops nothing; a batched `grain.MapDataset` is read through Grain's
    batch node. None when nothing says.
    """
    source = unwrap_source(source)
    declared = getattr(source, "dropped_samples", None)
    if declared is not None:
        value = declared() if callable(declared) else declared
        return int(value)
    if is_materialized(source):
        return 0
    if is_grain_map_dataset(source):
        return _grain_dropped(source)
    return None


def _grain_dropped(ds: Any) -> int | None:
    # Grain keeps a batch node's parent and settings on private attributes; read
    # them defensively, since a version that renames them must only lose the count.
    node = ds
    try:
        while node is not None:
            if type(node).__name__ == "BatchMapDataset":
                if not node._drop_remainder:
                    return 0
                return int(len(node._parents[0]) - len(node) * node._batch_size)
            parents: Any = getattr(node, "_parents", ())
            node = parents[0] if len(parents) == 1 else None
    except (AttributeError, IndexError, TypeError):
        return None
    return None
