"""One training epoch: the feed, then the hot loop (`calls.call_steps`).

Every run trains in the one hot loop, whatever its mode (automatic or manual), its
devices (one or a mesh) and its processes: blocks of batches staged with one
transfer, calls of 1 to steps_per_call steps of one program, no loss read back per
step (`calls.py`). A non-finite loss raises naming its step and epoch, and whether
the batch's inputs were already non-finite (`epoch_log.py`). Here: the feed opened
and closed, a gradient an epoch left unfinished dropped, an epoch that delivered
other than len() batches refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp

from ..data.prefetch import prefetch_config
from ..devices.agreement import StopAgreement
from ..errors import ConfigError
from . import feed as feeds
from .assembly import BlockAssembler
from .calls import ReadAheadPlan, call_steps, epoch_assembler
from .epoch_log import EpochLog, StepEvents
from .feed import open_feed, threads_assemble
from .read_ahead import read_first_block

LISTED = "materialized"
"""The prefetch path of a list of built batches: the one read ahead."""

if TYPE_CHECKING:
    from .context import EpochContext
    from .state import TrainState


def run_epoch(
    context: EpochContext,
    epoch: int,
    *,
    skip: int = 0,
    carried: tuple[float, int] = (0.0, 0),
    events: StepEvents | None = None,
    agreement: StopAgreement | None = None,
) -> EpochLog:
    """One epoch of micro-batches from the train split's feed; closed on every exit.

    It trains from the state `context.current()` holds and commits the new state
    (`context.commit`) on every exit, a raising one included (the old one's
    buffers were donated).
    `skip`: batches a stopped run already trained this epoch; they are read (so the
    epoch's order and the source's state stay as they were) and passed over.
    `carried`: their running loss sum and count, which the epoch's mean continues.
    `events`: called after each optimizer step it places an event on (mid-epoch
    validation and checkpoints, max_steps); it may end the epoch there.
    `agreement`: across processes, the stop every rank agrees on, which the loop
    reads instead of the process's own request (None in one process).
    """
    log = EpochLog(context, epoch, carried, skip)
    source = context.source
    bar = context.bar
    if bar is not None:
        bar.begin("train", len(source), epoch=epoch, max_epochs=context.max_epochs)
    threads = threads_assemble(source)
    assembler = epoch_assembler(context, epoch, skip, threads)
    ahead = context.read_ahead
    held = None
    if ahead is not None and not skip:
        held = ahead.take(epoch, source, assembler.settings)
    if held is not None:  # the epoch before read this one's first block
        feed, assembler = held.feed, held.assembler
    else:
        feed = _open(context, epoch, assembler)
    log.feed = feed
    plan = None
    if ahead is not None:
        plan = ReadAheadPlan(
            [] if held is None else held.items, _reader(context, epoch + 1, threads)
        )
    accum = context.accum
    try:
        delivered = call_steps(
            context, epoch, feed, log, assembler, events, agreement, read_ahead=plan
        )
    except BaseException:
        if accum > 1:  # it may have raised partway through an optimizer step
            context.commit(_zeroed_accumulator(context.current()))
        raise
    finally:
        feed.close()
    if delivered is not None:
        if delivered % accum:  # a source that ran short or long ended mid-step
            context.commit(_zeroed_accumulator(context.current()))
        _check_epoch_length(source, delivered, epoch)
    return log


def _open(context: EpochContext, epoch: int, assembler: BlockAssembler) -> Any:
    """Epoch `epoch`'s train pass, run by `assembler` where it stages."""
    return open_feed(
        context.source,
        epoch=epoch - 1,
        fields=context.prepared.routing.train_fields,
        name="train",
        assembler=assembler if assembler.stages else None,
    )


def _reader(
    context: EpochContext, epoch: int, threads: bool
) -> Callable[[], None] | None:
    """What reads epoch `epoch`'s first block ahead into `context.read_ahead`
    (`read_ahead.py`), or None where there is no such epoch or its batches are not
    a list read on this thread and staged on an accelerator (a pass with threads
    of its own, a `NoPrefetch` source, whose `set_epoch` another pass over it may
    call meanwhile, a CPU, several processes)."""
    ahead = context.read_ahead
    if ahead is None or epoch > context.max_epochs or threads:
        return None
    if jax.process_count() > 1 or prefetch_config(context.source).path != LISTED:
        return None
    if not feeds.stages_on_device():  # a CPU: host batches go as they are
        return None

    def read() -> None:
        assembler = epoch_assembler(context, epoch, 0, threads)
        feed = _open(context, epoch, assembler)
        block = read_first_block(epoch, context.source, feed, assembler)
        if block is not None:
            ahead.put(block)

    return read


def _zeroed_accumulator(state: TrainState) -> TrainState:
    """`state` without the gradient of an optimizer step an epoch left unfinished,
    so that no gradient carries into another epoch."""
    if state.accumulator is None:
        return state
    return state._replace(accumulator=jax.tree.map(jnp.zeros_like, state.params))


def _check_epoch_length(source: Any, delivered: int, epoch: int) -> None:
    """Refuse an epoch that delivered other than len(source) batches: the schedule
    horizon and the accumulation groups were fixed from len(), and a source that
    runs short (a one-shot iterator behind a reusable face) trains on less silently."""
    expected = len(source)
    if delivered != expected:
        raise ConfigError(
            f"The train split delivered {delivered} batches in epoch {epoch}, but "
            f"len() says {expected}. A source must yield len() batches every epoch "
            f"and start over on each iter() call; a one-shot iterator behind __iter__ "
            f"runs dry after the first epoch."
        )
