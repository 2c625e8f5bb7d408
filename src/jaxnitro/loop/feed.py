"""Where a phase's batches come from: the split's prefetch path, one pass at a time.

What a pass runs is the data layer's decision, taken once per pass
(`data.prefetch.open_pass`): a list of built batches (the "materialized" path) and a
`NoPrefetch` split are read inline, every other split runs its prefetch stream
(worker threads build the batches, calling `batch_at` for a fan-out-capable source).
Here: what each phase's pass prepares from a host batch. A training pass with
threads of its own groups its batches into blocks on its in-order thread, which
stacks each block and on an accelerator places it (`assembly.py`); read on the
consumer, it keeps the routed fields on the host, and the calls loop groups, stacks
and places them itself (`calls.py`). An evaluation pass on an accelerator has a
transfer thread stage each padded chunk on the device ahead of its forward; on a CPU
backend the host arrays go to the executable as they are (it places them itself, and
an explicit copy would only cost time: benchmarks/prefetch.py).

Either way the training loop gets `Staged(host, routed)` items and the time it waited
for them, for the once-per-epoch `data_wait_frac`; evaluation gets `EvalStaged` chunks,
padded to the eval width by their producer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax

from ..data.prefetch import (
    INLINE_PATHS,
    eval_prepare,
    open_pass,
    prefetch_config,
    routed_fields,
)
from ..data.stream import InlinePass, PrefetchStream, Staged
from ..data.transfer import transfer
from ..devices.placement import Placement
from .assembly import BlockAssembler


def stages_on_device() -> bool:
    """Whether batches are worth staging on the device ahead of the step; always
    across processes, where each batch is assembled from every process's rows."""
    return jax.default_backend() != "cpu" or jax.process_count() > 1


def _as_is(routed: dict[str, Any]) -> dict[str, Any]:
    return routed


def _batch_sharding(placement: Placement | None) -> Any:
    """Where a staged batch goes: split over the run's mesh, else the default
    device."""
    return None if placement is None else placement.data_sharding


def threads_assemble(split: Any) -> bool:
    """Whether a training pass over `split` runs threads of its own, so that one of
    them can assemble its blocks (`open_feed`): not a list of built batches nor a
    `NoPrefetch` split, which are read on the consumer."""
    return prefetch_config(split).path not in INLINE_PATHS


def open_feed(
    split: Any,
    *,
    epoch: int,
    fields: tuple[str, ...],
    name: str,
    assembler: BlockAssembler | None = None,
) -> InlinePass | PrefetchStream[Any]:
    """A training pass over `split` for 0-based `epoch`.

    With an `assembler` (a split whose pass runs threads: `threads_assemble`) the
    pass's in-order thread runs it: the pass yields its `Block`s, stacked and
    placed, then a `PassEnd`. Without, it yields `Staged(host, routed)` per batch,
    `routed` holding the routed `fields`, each checked as `batch_stream` checks
    them, as host arrays (a field the source already put on the device stays
    there), which the calls loop groups into blocks itself. Close it on every exit
    path.
    """
    if assembler is not None:
        return open_pass(split, assembler, epoch=epoch, name=name, stage=True)

    def prepare(host: Mapping[str, Any]) -> list[Staged]:
        return [Staged(host, routed_fields(host, fields, name))]

    return open_pass(split, prepare, epoch=epoch, name=name, stage=False)


def open_eval_feed(
    split: Any,
    *,
    select: Callable[[tuple[str, ...]], tuple[str, ...]],
    width: int,
    name: str,
    placement: Placement | None = None,
) -> InlinePass | PrefetchStream[Any]:
    """An evaluation pass over `split` (epoch 0's order): `EvalStaged` chunks.

    Each chunk's routed fields (`select(keys)`) are padded to `width` by whoever
    produces it (a prefetch thread, so the pad overlaps the previous forward, or the
    consumer on the inline paths); `host` stays unpadded. Close it on every exit.
    """
    on_device = stages_on_device()
    sharding = _batch_sharding(placement)
    place = (lambda part: transfer(part, sharding)) if on_device else _as_is
    prepare = eval_prepare(select, width, name, place)
    return open_pass(split, prepare, epoch=0, name=name, stage=on_device)
