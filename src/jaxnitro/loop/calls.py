"""The hot loop at steps_per_call > 1: several optimizer steps per dispatch.

The loop gathers a call's batches from the feed (host arrays on every backend),
stacks them with one `np.stack` per field (and, on an accelerator, places the stack
with one transfer), and runs the scanned program (`compile/scanned.py`) on them. It
reads back the PREVIOUS call's stacked losses while the device runs the current one,
and settles every micro-batch of it through `EpochLog` exactly as the unscanned loop
(`steps._steps`) does: the same running loss sum in the same order, the same train
lines at the same steps with the same values, a divergence named at its own step.

Where a call ends. At each call boundary the loop picks the call's length: the
steps_per_call, cut short so that the call ends exactly at the epoch's end and at the
next step event (max_steps, val_every_n_steps, checkpoint_every_n_steps), then
rounded down to a power of two. So every event and the epoch's end fall on a call
boundary, at their exact step, whatever the multiples, and a run compiles at most
1 + log2(steps_per_call) scanned programs (steps_per_call and the powers of two below
it, each once); an epoch of 60 steps at steps_per_call=8 runs 7 calls of 8 and one
of 4. A mid-epoch resume starts its calls at the batch the stop left.

Stop requests (`request_stop`, SIGTERM) are honoured at call boundaries: the epoch
ends after the call in flight. A stop asked for from a train line (settled a call
late) lands up to 2 * steps_per_call - 1 steps after that line's step, where an
unscanned run stops one step after it; what trains up to there is exact, and so is
its continuation.
Early stopping and Plateau decide at validations, which fall on call boundaries.
A `set_device` made while a call runs (from a logger or a monitor) takes effect from
the next call; a train line is settled a call after its step, as the unscanned loop
settles one a step after.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from ..compile.boundary import StepOutputs
from ..data.signature import batch_signature, changed_field
from ..data.transfer import transfer
from ..errors import ConfigError
from ..observe.counter import advance_progress_counter
from . import feed as feeds
from .cadence import NEVER
from .epoch_log import EpochLog, InFlight, Stacked, StepEvents, sliced
from .step_programs import (
    CallInputs,
    call_inputs,
    call_program,
    call_rng,
    check_batch,
    check_epoch_count,
    current_state,
)

if TYPE_CHECKING:
    from ..run.handle import Nitro


AUTO_CALL_SECONDS = 2e-3
"""steps_per_call="auto" makes a call about this long: long enough that its launch,
its argument placement and its Python (tens of microseconds) are a small part."""
AUTO_MOST = 16
"""The most steps "auto" puts in one call (a stop request waits for the call)."""


ACROSS_PROCESSES = (
    "steps_per_call={k} in a run across {count} processes: a scanned call's stacked "
    'batches have no layout on a mesh yet. Pass steps_per_call=1 (or "auto", '
    "which is 1 across processes) to train across processes."
)


def steps_per_call(nitro: Nitro) -> int:
    """The steps per call of the epoch about to run.

    The keyword's count, or for "auto": 1 for the first epoch a handle trains (it
    measures the step time, `nitro.status.step_seconds`), then the largest power
    of two up to `AUTO_MOST` whose call takes at most `AUTO_CALL_SECONDS` at the
    last epoch's step time. Every count trains the same steps bit for bit, so the
    choice changes the speed only. "auto" is 1 on a mesh, across processes and in
    manual training mode.

    Example: a 450 us step gets 4 steps a call, a 100 us step 16, a 5 ms step 1.
    """
    per_call = nitro.config.steps_per_call
    processes = jax.process_count()
    if per_call != "auto":
        if int(per_call) > 1 and processes > 1:
            raise ConfigError(ACROSS_PROCESSES.format(k=per_call, count=processes))
        return int(per_call)
    if nitro.prepared.manual or nitro.config.n_devs > 1 or processes > 1:
        return 1
    seconds = nitro.status.step_seconds
    if not seconds:
        return 1
    fits = min(AUTO_MOST, max(1, int(AUTO_CALL_SECONDS / seconds)))
    return 1 << (fits.bit_length() - 1)


def call_length(steps_per_call: int, left: int, until_event: int) -> int:
    """The steps of the next call: `steps_per_call`, or, when the epoch's end
    (`left` steps away) or the next event (`until_event` steps away) comes sooner,
    the largest power of two that does not pass it.

    >>> [call_length(8, left, 100) for left in (60, 7, 4, 3, 1)]
    [8, 4, 4, 2, 1]
    >>> call_length(3, 100, 2)
    2
    """
    room = min(steps_per_call, left, until_event)
    if room >= steps_per_call:
        return steps_per_call
    if room <= 1:
        return 1
    return 1 << (room.bit_length() - 1)


@dataclass
class _Call:
    """A dispatched call whose losses have not been read back yet."""

    reported: StepOutputs  # every leaf stacked (steps, ...) or (steps, accum, ...)
    first: int  # the optimizer steps done before it
    batches: list[tuple[dict[str, Any], int]]  # each micro-batch: (host batch, index)
    lines: list[dict[str, float] | None]  # each step's schedule line, when logged


def _settle_call(log: EpochLog, call: _Call, accum: int) -> None:
    """Settle each micro-batch of `call`, in order, as the unscanned loop would."""
    reported = call.reported
    losses = np.asarray(reported.loss)  # one read-back for the call's losses
    outputs = None if reported.outputs is None else jax.device_get(reported.outputs)
    terms, stats = reported.terms, reported.stats
    for j, (host, index) in enumerate(call.batches):
        step, micro = divmod(j, accum)
        at = (step,) if accum == 1 else (step, micro)
        ends = micro == accum - 1
        log.settle(
            InFlight(
                losses[at],
                Stacked(terms, at) if terms else terms,
                Stacked(stats, at) if stats else stats,
                None if outputs is None else sliced(outputs, at),
                host,
                call.first + step + 1,
                index,
                ends,
                call.lines[step] if ends else None,
            )
        )


def _stacked(routed: list[dict[str, Any]], steps: int, accum: int) -> dict[str, Any]:
    """A call's routed batches as one: each field `(steps, B, ...)`, or
    `(steps, accum, B, ...)` under accumulation (one host copy per field).

    Raises ValueError when a field's batches differ in shape or dtype."""
    out = {}
    for name in routed[0]:
        arrays = [np.asarray(batch[name]) for batch in routed]
        if len({a.dtype for a in arrays}) > 1:  # np.stack would promote them
            raise ValueError(f"field {name} holds several dtypes")
        stack = np.stack(arrays)
        out[name] = (
            stack if accum == 1 else stack.reshape((steps, accum, *stack.shape[1:]))
        )
    return out


def _refuse_changed(pending: list[Any], signature: Any, epoch: int) -> None:
    """Raise the refusal naming the first batch of a call whose field left the
    compiled signature (as the unscanned loop names it); nothing when none did."""
    for _, batch, index in pending:
        refusal = changed_field(signature, batch, "train", index, epoch)
        if refusal is not None:
            raise ConfigError(refusal) from None


def call_steps(
    nitro: Nitro,
    epoch: int,
    feed: Any,
    log: EpochLog,
    bar: Any,
    skip: int = 0,
    events: StepEvents | None = None,
) -> int | None:
    """The hot loop of one epoch in calls of several steps (`steps._steps`'s
    contract: the state committed to the handle on every exit; returns how many
    batches the feed delivered, or None when a stop or an event ended the epoch)."""
    per_call = steps_per_call(nitro)
    accum = nitro.config.accum
    seed = nitro.config.seed
    names = nitro.prepared.routing.train_fields
    expected = nitro.prepared.routing.train_batch
    assert expected is not None
    plan = nitro.prepared.plan
    assert plan is not None
    source = nitro.data["train"]
    autolog = nitro.config.autolog_schedules and log.logging
    every = log.every
    on_device = feeds.stages_on_device()  # read here: a test may stand it in
    # Without varying schedules every call of a length takes the same inputs.
    constant = plan.is_constant and not nitro.prepared.device_schedules
    made: dict[int, tuple[dict[str, Any], CallInputs]] = {}  # by call length
    programs: dict[Any, Any] = {}
    start = nitro.train_state
    weights, model_state = start.weights, start.model_state
    accumulator, step = start.accumulator, start.step
    pending: list[tuple[dict[str, Any], dict[str, Any], int]] = []
    length = 0
    count: int | None = None  # the epoch's batch count, read once its plan is drawn
    signature: Any = None
    in_flight: _Call | None = None
    delivered: int | None = 0
    profiler = nitro.status.profiler
    event = NEVER if events is None else events.next_after(step)
    try:
        for index, (full, routed) in enumerate(feed):
            check_batch(routed, names, expected, index, epoch)
            if index < skip:  # trained before a stop: this epoch continues after it
                feed.release(routed)
                if bar is not None:
                    bar.step()
                delivered = index + 1
                continue
            if count is None:  # the epoch's first trained batch: its plan is drawn
                if accum > 1:
                    check_epoch_count(source, accum, epoch)
                count = len(source)
                signature = batch_signature(routed)
            if not pending:
                left = max((count - index) // accum, 1)
                length = call_length(per_call, left, event - step)
            pending.append((full, routed, index))
            delivered = index + 1
            if len(pending) < length * accum:
                continue
            if profiler is not None:
                for done in range(step, step + length):
                    profiler.at_step(done, weights)
            device = nitro.device_values()  # set_device may have replaced it
            memo = made.get(length) if constant else None
            if memo is not None and memo[0] is device:
                inputs = memo[1]
            else:
                inputs = call_inputs(nitro, plan, device, step, length, accum)
                if constant:
                    made[length] = (device, inputs)
            rng = call_rng(seed, step, length, accum)
            try:
                batches = _stacked([r for _, r, _ in pending], length, accum)
            except ValueError:  # fields of several shapes do not stack
                _refuse_changed(pending, signature, epoch)
                raise
            if on_device:
                batches = transfer(batches, None)
            program = programs.get((length, inputs.layout))
            if program is None:  # a new length: held to the epoch's first batch
                _refuse_changed(pending, signature, epoch)
                program = call_program(
                    nitro,
                    current_state(start, weights, model_state, accumulator, step),
                    batches,
                    inputs,
                    rng,
                )
                programs[(length, inputs.layout)] = program
            try:
                weights, model_state, accumulator, reported = program(
                    inputs.values_shared,
                    inputs.values_steps,
                    weights,
                    model_state,
                    accumulator,
                    batches,
                    inputs.hp_shared,
                    inputs.hp_steps,
                    rng,
                )
            except TypeError:  # an executable refusing its arguments: no step ran
                _refuse_changed(pending, signature, epoch)
                raise
            lines = [
                plan.scheduled_log(values)
                if autolog and (step + i + 1) % every == 0
                else None
                for i, values in enumerate(inputs.schedule_values)
            ]
            call = _Call(reported, step, [(f, at) for f, _, at in pending], lines)
            step += length
            advance_progress_counter(length)
            for _, batch, _ in pending:
                if bar is not None:
                    bar.step()
                feed.release(batch)
            pending = []
            if in_flight is not None:
                _settle_call(log, in_flight, accum)
            in_flight = call
            if step >= event:  # calls end at events: only a step-based run's
                assert events is not None
                _settle_call(log, call, accum)
                in_flight = None
                nitro.commit_state(
                    current_state(start, weights, model_state, accumulator, step)
                )
                leave = events.fire(step, log)
                event = events.next_after(step)
                now = nitro.train_state  # the events only read it
                weights, model_state = now.weights, now.model_state
                accumulator = now.accumulator
                if leave:
                    delivered = None
                    break
            if nitro.status.stop_requested:
                delivered = None
                break
        if in_flight is not None:
            _settle_call(log, in_flight, accum)
    finally:
        nitro.commit_state(
            current_state(start, weights, model_state, accumulator, step)
        )
    return delivered
