"""Prefetch settings per split, the path each resolves to, and the phase streams.

Every split is wrapped at setup (`auto_prefetch`) in a `PrefetchIterator` at the
defaults, unless it already is one or a `NoPrefetch`. The wrapper holds only the
source and its settings; each phase builds its own stream from it (`batch_stream`
for training, `eval_stream` for evaluation) and closes it when the phase ends, so
training and validation prefetch memory never coexist. A phase opens its pass
with `open_pass`, which resolves the split's path once and reads a list of built
batches or a `NoPrefetch` split inline where nothing is staged on a device.

    >>> batches = [{"x": np.full((2, 3), i, np.float32)} for i in range(3)]
    >>> split = PrefetchIterator(batches, workers=2)
    >>> prefetch_config(split).path
    'materialized'
    >>> with batch_stream(split, ("x",)) as stream:
    ...     for host, device in stream:
    ...         stream.release(device)  # once the step that used it has run
    >>> stream.stats().batches
    3
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any, Literal, NamedTuple

import jax
import numpy as np

from ..errors import ConfigError, NitroWarning, RoutingError
from ..keys.host_cpus import usable_cpus
from .grain_adapter import as_indexed
from .padding import pad_batch
from .pipeline import Prepare
from .protocol import (
    SplitWrapper,
    fanout_capable,
    is_materialized,
    missing_trait_methods,
    unwrap_source,
)
from .sources import batch_size, check_source_options
from .stream import EvalStaged, InlinePass, PrefetchStream, Staged
from .transfer import is_numeric_dtype, transfer

PrefetchPath = Literal[
    "fanout", "fanout_unordered", "single", "materialized", "single_no_trait", "inline"
]


def default_prefetch_workers() -> int:
    """Worker threads per split by default: the usable CPU cores plus two, at most 8.

    Two more threads than cores because a worker is often not computing: it waits
    for the GIL, for a wake-up, or on I/O, and its core idles meanwhile. Measured on
    2 cores with a loader costing one step a batch (benchmarks/prefetch.py), the
    loop waited on data 4.2-9.6% of the epoch with 2 workers and 1.2-3.2% with 4.

    Examples:
        >>> 3 <= default_prefetch_workers() <= 8
        True
    """
    return min(8, usable_cpus() + 2)


def _count(name: str, value: Any, minimum: int, extra: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ConfigError(f"`{name}` must be an int, got {value!r}.{extra}")
    if value < minimum:
        raise ConfigError(f"`{name}` must be >= {minimum}, got {value}.{extra}")
    return int(value)


_NO_PREFETCH_HINT = (
    " To run a split's host data path inline on the training thread, wrap it in "
    "NoPrefetch(source) instead: opting out is a choice visible in the code, not a "
    "buffer size."
)
_HOST_BATCHES = (
    "`host_batches` must be >= `workers` ({workers}), got {host}: each worker needs "
    "a host slot to build into, and ordered delivery holds finished batches in its "
    "reorder buffer until the next one in order arrives, so with fewer slots than "
    "workers the stream can deadlock waiting on a batch that was never handed out. "
    "Pass host_batches >= workers (the default is 2 * workers)."
)


class PrefetchIterator(SplitWrapper):
    """Prefetch settings for a split: worker threads, one transfer thread, buffers.

    Setup wraps every split in one of these at the defaults (`auto_prefetch`), so
    construct one only to change them: return it from `build_data` in place of
    the source, e.g. `{"train": PrefetchIterator(loader, workers=4)}`. `NoPrefetch`
    opts a split out. The wrapper holds only the source and its settings; each
    phase builds its own stream from it and closes it when the phase ends, so the
    training and validation prefetch memory never coexist. The settings a split
    actually gets may differ from those asked for: see `prefetch_config`.

    Args:
        source: the split: a sized, restartable iterable of batch dicts, each field
            an array of shape (batch, ...). Not itself a `PrefetchIterator` or
            `NoPrefetch`.
        workers: threads building host batches, an int >= 1 (default
            `default_prefetch_workers()`: the usable cores plus two, at most 8).
            More than one needs the fan-out trait (`begin_epoch` and `batch_at`, or
            a `grain.MapDataset`); without it the split gets one producer, and a
            list of built batches always gets one.
        device_batches: batches staged on the device ahead of the consumer, an int
            >= 1 (default 1). Device residency is at most `device_batches + 2`
            batches.
        host_batches: host batches alive at once between the workers and the
            transfer (default `2 * workers`); an int, at least `workers`.
        ordered: deliver in the source's order through a reorder buffer, so a run
            reproduces bitwise at any `workers`. False delivers batches as they
            finish; each is still delivered exactly once per epoch.

    `len()` and `iter()` pass through to the source: iterating the wrapper by hand
    starts no thread. Indexing and the source's other attributes pass through too.

    Raises:
        ConfigError: `workers`, `device_batches` or `host_batches` is not an int or
            is below its minimum (`device_batches=0` names `NoPrefetch`, the way
            to opt out); `host_batches` is below `workers`; `ordered` is not a
            bool; `source` is already wrapped.

    Examples:
        >>> batches = [{"x": np.zeros((4, 2), np.float32)}] * 3
        >>> split = PrefetchIterator(batches, workers=2)
        >>> split
        PrefetchIterator(list, workers=2, device_batches=1, host_batches=4,
                         ordered=True)
        >>> len(split), prefetch_config(split).path  # a list: one producer
        (3, 'materialized')
        >>> PrefetchIterator([], workers=2, device_batches=0)
        Traceback (most recent call last):
        ...
        jaxnitro.errors.ConfigError: `device_batches` must be >= 1, got 0. To run ...
    """

    __slots__ = ("device_batches", "host_batches", "ordered", "workers")

    def __init__(
        self,
        source: Any,
        *,
        workers: int | None = None,
        device_batches: int = 1,
        host_batches: int | None = None,
        ordered: bool = True,
    ) -> None:
        super().__init__(source)
        self.workers = _count(
            "workers", default_prefetch_workers() if workers is None else workers, 1
        )
        self.device_batches = _count(
            "device_batches", device_batches, 1, _NO_PREFETCH_HINT
        )
        host = 2 * self.workers if host_batches is None else host_batches
        self.host_batches = _count("host_batches", host, 1)
        if self.host_batches < self.workers:
            raise ConfigError(
                _HOST_BATCHES.format(workers=self.workers, host=self.host_batches)
            )
        if not isinstance(ordered, bool):
            raise ConfigError(f"`ordered` must be True or False, got {ordered!r}.")
        self.ordered = ordered

    def __repr__(self) -> str:
        return (
            f"PrefetchIterator({type(self.source).__name__}, workers={self.workers}, "
            f"device_batches={self.device_batches}, host_batches={self.host_batches},"
            f" ordered={self.ordered})"
        )


class NoPrefetch(SplitWrapper):
    """Opt a split out of prefetch: its host data path runs inline on the consumer.

    `len()` and `iter()` pass through to the source.
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return f"NoPrefetch({type(self.source).__name__})"


class PrefetchConfig(NamedTuple):
    """The settings a split resolves to, which may differ from the requested ones."""

    device_batches: int
    host_batches: int
    workers: int
    ordered: bool
    path: PrefetchPath
    """`fanout`: workers over batch_at, in the source's order. `fanout_unordered`:
    the same, delivered as they finish. `single`: one producer over iter() because
    workers == 1 was asked for. `materialized`: one producer over a list of built
    batches. `single_no_trait`: one producer because the source lacks the fan-out
    trait. `inline`: no thread at all (`NoPrefetch`)."""


def _settings(split: Any) -> PrefetchIterator | NoPrefetch:
    if isinstance(split, PrefetchIterator | NoPrefetch):
        return split
    return PrefetchIterator(unwrap_source(split))


def prefetch_config(split: Any) -> PrefetchConfig:
    """The prefetch settings and path `split` resolves to (a bare split: defaults).

    Examples:
        >>> prefetch_config(NoPrefetch([]))  # doctest: +NORMALIZE_WHITESPACE
        PrefetchConfig(device_batches=0, host_batches=0, workers=0, ordered=True,
                       path='inline')
    """
    settings = _settings(split)
    if isinstance(settings, NoPrefetch):
        return PrefetchConfig(0, 0, 0, True, "inline")
    source, device = settings.source, settings.device_batches
    if is_materialized(source):
        return PrefetchConfig(device, 1, 1, True, "materialized")
    if settings.workers == 1:
        return PrefetchConfig(device, 1, 1, True, "single")
    if not fanout_capable(source):
        return PrefetchConfig(device, 1, 1, True, "single_no_trait")
    path: PrefetchPath = "fanout" if settings.ordered else "fanout_unordered"
    return PrefetchConfig(
        device, settings.host_batches, settings.workers, settings.ordered, path
    )


def auto_prefetch(
    collection: Mapping[str, Any],
    *,
    workers: int | None = None,
    device_batches: int = 1,
    host_batches: int | None = None,
    ordered: bool = True,
) -> dict[str, Any]:
    """Every split wrapped in a `PrefetchIterator`, unless it already is one or a
    `NoPrefetch`. Eval splits included. Call at setup after derive, the schema probe
    and the contract checks, which see the collection as build_data returned it.

    Examples:
        >>> wrapped = auto_prefetch({"train": [], "val": NoPrefetch([])})
        >>> [type(s).__name__ for s in wrapped.values()]
        ['PrefetchIterator', 'NoPrefetch']
    """
    return {
        name: split
        if isinstance(split, SplitWrapper)
        else PrefetchIterator(
            split,
            workers=workers,
            device_batches=device_batches,
            host_batches=host_batches,
            ordered=ordered,
        )
        for name, split in collection.items()
    }


_SINGLE_NO_TRAIT = (
    "The train split ({kind}) runs in ONE producer thread: it lacks {missing}, so "
    "its batches cannot be built by several workers. Define `begin_epoch(self) -> "
    "plan` (re-plan the epoch: shuffle, draw augmentation seeds) and `batch_at(self, "
    "i, plan=None) -> batch` (i is a BATCH index in range(len(source)), not a sample "
    "offset), have `__iter__` call begin_epoch, and verify them with "
    "jaxnitro.data.check_batch_at(source, values=True). A grain.MapDataset and a list "
    "of built batches need nothing. To keep one producer on purpose, pass "
    "PrefetchIterator(source, workers=1)."
)


def check_prefetch(collection: Mapping[str, Any]) -> dict[str, PrefetchConfig]:
    """Setup's data checks on a wrapped collection; the resolved config per split.

    Runs `check_source_options` on every split's source and warns when the train
    split resolves to `single_no_trait`.
    """
    configs = {}
    for name, split in collection.items():
        cfg = prefetch_config(split)
        source = unwrap_source(split)
        check_source_options(source, name, cfg)
        if name == "train" and cfg.path == "single_no_trait":
            missing = " and ".join(f"`{m}`" for m in missing_trait_methods(source))
            warnings.warn(
                _SINGLE_NO_TRAIT.format(kind=type(source).__name__, missing=missing),
                NitroWarning,
                stacklevel=2,
            )
        configs[name] = cfg
    return configs


def prefetch_report(cfg: PrefetchConfig) -> dict[str, Any]:
    """The binding report's prefetch entries for one split's config."""
    return {
        "prefetch_workers": cfg.workers,
        "prefetch_device_batches": cfg.device_batches,
        "prefetch_host_batches": cfg.host_batches,
        "prefetch_ordered": cfg.ordered,
        "prefetch_path": cfg.path,
    }


def source_view(split: Any) -> Any:
    """The object a stream reads: the source, with a Grain dataset adapted.

    A wrapper keeps its adapter, so the adapter's epoch count lives as long as the
    split.
    """
    if isinstance(split, SplitWrapper):
        if split._view is None:
            split._view = as_indexed(split.source)
        return split._view
    return as_indexed(split)


def prepared_stream(
    split: Any,
    prepare: Prepare,
    *,
    epoch: int | None = None,
    name: str = "split",
    stage: bool = True,
    join_timeout: float = 10.0,
) -> PrefetchStream[Any]:
    """A stream over one pass of `split`, each host batch mapped through `prepare`.

    `prepare(host) -> [item, ...]` runs on the transfer thread (on the consumer for
    `NoPrefetch`); each item carries a `.device` pytree the stream owns and frees.
    `stage=False` says `prepare` places nothing on a device (the CPU backend's
    executables take host arrays): the fan-out's workers then run it themselves and
    no transfer thread is started.
    `epoch` (0-based) positions a source that has `set_epoch` (the Grain adapter
    does), so a resumed run reads the same order.
    """
    return _stream(
        split,
        prefetch_config(split),
        prepare,
        epoch=epoch,
        name=name,
        stage=stage,
        join_timeout=join_timeout,
    )


def _stream(
    split: Any,
    cfg: PrefetchConfig,
    prepare: Prepare,
    *,
    epoch: int | None,
    name: str,
    stage: bool,
    join_timeout: float = 10.0,
) -> PrefetchStream[Any]:
    """`prepared_stream` with the split's config already resolved."""
    view = source_view(split)

    def set_epoch() -> None:
        seek = getattr(view, "set_epoch", None)
        if epoch is not None and callable(seek):
            seek(epoch)

    return PrefetchStream(
        view,
        prepare,
        path=cfg.path,
        name=name,
        workers=cfg.workers,
        device_batches=max(cfg.device_batches, 1),
        host_batches=cfg.host_batches,
        ordered=cfg.ordered,
        set_epoch=set_epoch,
        stage=stage,
        join_timeout=join_timeout,
    )


INLINE_PATHS = ("materialized", "inline")
"""The paths whose batches cost nothing to produce: read on the consumer's thread
when nothing is staged on a device."""


def open_pass(
    split: Any, prepare: Prepare, *, epoch: int, name: str, stage: bool
) -> InlinePass | PrefetchStream[Any]:
    """One pass over `split` for 0-based `epoch`, each host batch through `prepare`.

    The split's path is resolved once, here: a list of built batches (the
    "materialized" path) and a `NoPrefetch` split are read inline unless `stage`
    (an `InlinePass`: producing a batch is a pointer load, and threads would only add
    hand-offs); every other split runs its prefetch stream. Either way the pass
    counts the time its consumer waited (`wait_seconds`), frees what it staged
    (`release`) and is closed on every exit (`close`).
    """
    cfg = prefetch_config(split)
    if cfg.path in INLINE_PATHS and not stage:
        return InlinePass(split, epoch, prepare)
    return _stream(split, cfg, prepare, epoch=epoch, name=name, stage=stage)


def routed_fields(
    host: Mapping[str, Any], fields: tuple[str, ...], name: str
) -> dict[str, Any]:
    """The routed `fields` of one host batch of split `name`, each checked.

    A field missing from the batch, or one whose dtype cannot go to the device, is
    refused with a `RoutingError` naming it. A `jax.Array` field is kept as it is;
    any other value becomes a NumPy array.
    """
    try:
        routed = {k: host[k] for k in fields}
    except KeyError:
        missing = next(k for k in fields if k not in host)
        raise RoutingError(
            f"A batch of split `{name}` has no field `{missing}`, which the hooks "
            f"declare and the first batch had. It has: {', '.join(host) or 'none'}. "
            f"Every batch of a split must carry the same fields."
        ) from None
    for k, value in routed.items():
        # Per batch on the training thread: the usual NumPy field costs one test.
        if type(value) is np.ndarray and value.dtype.kind in "biufc":
            continue
        if isinstance(value, jax.Array):
            continue
        value = routed[k] = np.asarray(value)
        if not is_numeric_dtype(value.dtype):
            raise RoutingError(
                f"Batch field `{k}` of split `{name}` has dtype {value.dtype}, which "
                f"cannot go to the device: a field a traced hook declares must be "
                f"numeric. Encode it as numbers in the source, or read it only in "
                f"host-side hooks."
            )
    return routed


def batch_stream(
    split: Any,
    fields: tuple[str, ...],
    *,
    epoch: int | None = None,
    sharding: Any = None,
    name: str = "train",
) -> PrefetchStream[Staged]:
    """The training loop's stream: `Staged(host, device)` per batch.

    `host` is the source's batch (every field, host arrays (B, ...)); `device` holds
    only `fields` (the routed ones) as device arrays (B, ...), on `sharding` when
    given (a `jax.sharding.Sharding` or device), else the default device.
    """

    def prepare(host: Mapping[str, Any]) -> list[Staged]:
        return [Staged(host, transfer(routed_fields(host, fields, name), sharding))]

    return prepared_stream(split, prepare, epoch=epoch, name=name)


def eval_stream(
    split: Any,
    fields: tuple[str, ...],
    width: int,
    *,
    sharding: Any = None,
    name: str = "val",
) -> PrefetchStream[EvalStaged]:
    """An evaluation pass: `EvalStaged(host, device, n_real)` per chunk of <= width.

    A short batch is padded to `width` (repeating its last sample) before the
    transfer, so the pad and the copy overlap the previous forward; a wider batch is
    cut into chunks of `width`. `host` is the chunk unpadded (every field), `n_real`
    its real samples; slice outputs back to `n_real`. Reads epoch 0's order.
    """
    width = _count("width", width, 1)
    prepare = eval_prepare(
        lambda keys: fields, width, name, lambda part: transfer(part, sharding)
    )
    return prepared_stream(split, prepare, epoch=0, name=name)


def eval_prepare(
    select: Callable[[tuple[str, ...]], tuple[str, ...]],
    width: int,
    name: str,
    place: Callable[[dict[str, Any]], dict[str, Any]],
) -> Prepare:
    """The prepare step of an evaluation pass: host batch -> `EvalStaged` chunks.

    `select(keys)` gives the routed fields of a batch with those keys; each chunk's
    routed fields are padded to `width` and handed to `place` (a transfer, or
    nothing on a backend whose executables take host arrays).
    """

    def prepare(host: Mapping[str, Any]) -> list[EvalStaged]:
        fields = select(tuple(host))
        routed = routed_fields(host, fields, name)
        size = batch_size(routed)
        if size <= width:
            return [EvalStaged(dict(host), place(pad_batch(routed, width)), size)]
        items = []
        for start in range(0, size, width):
            chunk = {k: np.asarray(v)[start : start + width] for k, v in host.items()}
            part = {k: chunk[k] for k in fields}
            count = batch_size(part)
            last = start + width >= size
            items.append(EvalStaged(chunk, place(pad_batch(part, width)), count, last))
        return items

    return prepare
