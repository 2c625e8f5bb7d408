"""The hot loop: calls of one to K optimizer steps.

Every run trains here: the automatic mode and manual mode (the experiment's own
`train_step` as the program's step), on one device or a mesh (a block split along
its batch axis), in one process or several (each rank stacks its own rows; a call
ends at every agreement point, where the ranks vote on a stop).


The loop gathers a block of K steps' batches from the feed (host arrays on every
backend), stacks them with one `np.stack` per field, and runs calls of the train
program (`compile/scanned.py`) over the block (a block read by one call goes to its
executable as host arrays; one read by several is placed once: `_staged`),
`steps_per_call` steps a call, cut short at the epoch's end and at the next step
event. One program serves every call length, so steps_per_call=1 is a call of
length 1 of this same loop, and a run compiles one train program (at
steps_per_call=1 one without the loop around its step, which cost a CPU step about
10%). On a CPU backend at steps_per_call=1 a block is one batch, handed to the
executable as a view of the host arrays: there a transfer costs nothing to batch,
and a stack would only copy.

Per call the host transfers nothing: the block's position and the call's length are
device constants, the step number and the step rng are carried on the device, and the
schedule values are stacked per block (placed once an epoch while none varies). Per
call it reads nothing back either: each micro-batch's loss lands in a device ring,
which the host reads only when something needs a loss: the train line of a logged
step, the progress bar (a few times a second), a step event, the epoch's end, and at
the latest every `SETTLE_EVERY` micro-batches, so the divergence check runs while
the device keeps its queue. A read is planned a call ahead: the call holding what is
needed starts its ring's copy to the host as it is dispatched, and the host reads it
after dispatching the next call (a blocking read of a fresh result cost a TPU step
about 400 us). Settling goes through `EpochLog` as if each step were read alone (a
call that carries only losses in one pass, others micro-batch by micro-batch): the
same running loss sum in the same order, the same train lines at the same steps with
the same values whatever the steps per call, a divergence named at its own step
(found at the next read, up to `SETTLE_EVERY` micro-batches later, with no
rollback).
A settled call's stacked train_metrics stay on the device for the epoch's summary
line (`TrainMeans`): summed by one small program every `FOLD_EVERY` calls, read back
once at the epoch's end.

Where a call ends. At each call boundary the loop picks the call's length: the
steps_per_call, cut short so that the call ends exactly at the epoch's end and at the
next step event (max_steps, val_every_n_steps, checkpoint_every_n_steps) and at the
block's end. So every event and the epoch's end fall on a call boundary, at their
exact step. A mid-epoch resume starts its blocks at the batch the stop left.

Stop requests (`request_stop`, SIGTERM) are honoured at call boundaries: the epoch
ends after the call in flight. A stop asked for from a train line (settled a call
late) lands up to 2 * steps_per_call - 1 steps after that line's step; what trains
up to there is exact, and so is its continuation. Early stopping and Plateau decide
at validations, which fall on call boundaries. A `set_device` made while a call runs
(from a logger or a monitor) takes effect from the next call.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from ..compile.boundary import StepOutputs
from ..compile.packed import (
    Packing,
    pack_program,
    packing_of,
    packs_state,
    unpack_program,
)
from ..compile.scanned import (
    RING_HEAD,
    TrainCallArgs,
    call_positions,
    new_ring,
    ring_losses,
)
from ..data.signature import batch_signature
from ..data.transfer import transfer
from ..devices.agreement import StopAgreement
from ..devices.placement import Placement
from ..observe.counter import advance_progress_counter
from . import feed as feeds
from .accumulation import Accumulation
from .blocks import (
    DIRECT_BATCH_BYTES,
    block_steps,
    host_bytes,
    refuse_changed,
    stacked_block,
)
from .cadence import NEVER
from .context import EpochContext
from .epoch_log import EpochLog, InFlight, Stacked, StepEvents, sliced
from .step_programs import (
    CallInputs,
    call_inputs,
    call_program,
    check_batch,
    current_state,
)

AUTO_CALL_SECONDS = 8e-3
"""steps_per_call="auto" makes a call about this long: long enough that what a call
costs the host beside its steps (on a TPU host its launch, its block's stack and
transfer and its Python: 0.3-0.6 ms) is a small part, short enough that a stop
request waits little."""
AUTO_MOST = 16
"""The most steps "auto" puts in one call (a stop request waits for the call)."""
TALLY_SIZE = 512
"""Micro-batch losses the device ring holds (float32)."""
SETTLE_EVERY = 256
"""The most micro-batches the loop leaves unread: the divergence check's latency."""
SETTLE_HOST_BYTES = 64 * 2**20
"""The most host-batch bytes the unread micro-batches may hold (kept for a
divergence message); fewer micro-batches are left unread where they are large."""
BAR_SECONDS = 0.25
"""How often the progress bar's loss is refreshed (a read-back each time)."""


def steps_per_call(setting: int | str, step_seconds: float | None) -> int:
    """The steps per call of the epoch about to run, for the keyword's `setting`.

    The keyword's count, or for "auto": 1 while nothing was measured
    (`step_seconds` None), else the largest power of two up to `AUTO_MOST` whose
    call takes at most `AUTO_CALL_SECONDS` at that step time (a handle measures
    its first epoch at 1 and keeps the count chosen from it: `run/training.py`).
    Every count trains the same steps bit for bit, so the choice changes the speed
    only. "auto" is 1 across processes: each process would measure its own step
    time, and every rank must run the same calls.

    >>> [steps_per_call("auto", s) for s in (None, 1e-3, 450e-6, 10e-3)]
    [1, 8, 16, 1]
    >>> steps_per_call(3, 1e-6)
    3
    """
    if setting != "auto":
        return int(setting)
    if jax.process_count() > 1:
        return 1
    seconds = step_seconds
    if not seconds:
        return 1
    fits = min(AUTO_MOST, max(1, int(AUTO_CALL_SECONDS / seconds)))
    return 1 << (fits.bit_length() - 1)


def call_length(steps_per_call: int, left: int, until_event: int) -> int:
    """The steps of the next call: `steps_per_call`, or fewer when the block's or
    epoch's end (`left` steps away) or the next event (`until_event` steps away)
    comes sooner.

    >>> [call_length(8, left, 100) for left in (60, 7, 4, 3, 1)]
    [8, 7, 4, 3, 1]
    >>> call_length(3, 100, 2)
    2
    """
    return max(1, min(steps_per_call, left, until_event))


_CARRIED: dict[str, Any] = {}
"""What one epoch's calls leave for the next, so an epoch starts without placing
anything (each placement cost 170-310 us on a TPU, and a short epoch pays it in
full): "ring" `((seed, step, size), ring)`, the counter and loss ring, "inputs"
`(plan, device values, K, CallInputs)` of a plan with no varying schedule."""


def _placed(value: Any, placement: Placement | None) -> Any:
    """`value` on the device, or replicated over the run's mesh."""
    if placement is None:
        return jax.device_put(value)
    return placement.place(value, "replicated")


def _ring(seed: int, step: int, size: int, placement: Placement | None) -> Any:
    """The device ring of `size` losses with the counter `(seed, step, 0)`
    (`compile/scanned.py`): the last epoch's, when it ended there (its old losses
    are never read)."""
    held = _CARRIED.get("ring")
    if held is not None and held[0] == (seed % 2**32, step, size):
        return held[1]
    return _placed(new_ring(seed, step, size), placement)


def _positions(size: int, placement: Placement | None) -> tuple[Any, ...]:
    """The block positions 0..size as device scalars (`call_positions`), on the
    run's mesh when there is one."""
    if placement is None:
        return call_positions(size)
    held = _CARRIED.get("positions")
    if held is None or held[0] != (size, placement.key()):
        values = _placed([np.int32(i) for i in range(size + 1)], placement)
        held = _CARRIED["positions"] = ((size, placement.key()), tuple(values))
    return held[1]


def _state_trees(state: Any) -> tuple[Any, Any, Any]:
    """A TrainState's `(Weights, model_state, accumulator)`: what a call carries."""
    return state.weights, state.model_state, state.accumulator


def _same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return all(x is y for x, y in zip(a, b, strict=True))


def _carry_in(state: Any, packed: bool) -> tuple[Packing | None, tuple[Any, Any, Any]]:
    """How the calls pass `state`, and their state arguments (`compile/scanned.py`):
    `(None, its trees)`, or packed (`compile/packed.py`) its packing and flat
    buffers: the last epoch's both when the handle still holds the trees they were
    unpacked into, so an epoch starts without a dispatch or a walk of the trees
    (that walk cost a short epoch about 0.3 ms on the chip's host)."""
    trees = _state_trees(state)
    held = _CARRIED.pop("packed", None)
    if not packed:
        return None, trees
    if held is not None and _same(held[1], trees):
        packing, carry = held[0], held[2]
    else:
        packing = packing_of(trees)
        if packing is None:  # too large, or leaves that have no buffer
            return None, trees
        carry = pack_program(packing)(trees), (), ()
    # What the first call would donate unpacked (the Weights and the accumulator)
    # is released now, as a donation releases it: the flat buffers hold the state.
    for leaf in jax.tree.leaves((state.weights, state.accumulator)):
        if isinstance(leaf, jax.Array) and not leaf.is_deleted():
            leaf.delete()
    return packing, carry


def _carry_out(
    start: Any, carry: tuple[Any, Any, Any], step: int, packing: Packing | None
) -> Any:
    """The training state the calls have reached, as the handle holds it (new
    buffers: packed ones stay valid for the next call)."""
    if packing is None:
        return current_state(start, *carry, step)
    if any(flat.is_deleted() for flat in carry[0]):
        # A call that failed after taking them (its donation): the state is gone,
        # as an unpacked call's would be; unpacking now would hide the failure.
        return current_state(start, *_state_trees(start), step)
    weights, model_state, accumulator = unpack_program(packing)(carry[0])
    return current_state(start, weights, model_state, accumulator, step)


@dataclass
class _Call:
    """A dispatched call whose losses have not been read back yet."""

    reported: StepOutputs  # every leaf stacked (K, ...) or (K, accum, ...)
    first: int  # the optimizer steps done before it
    batches: list[tuple[dict[str, Any], int]]  # each micro-batch: (host batch, index)
    lines: list[dict[str, float] | None]  # each step's schedule line, when logged
    ring: Any  # the counter and loss ring as this call left it


def _settle(log: EpochLog, calls: list[_Call], accum: int) -> None:
    """Settle each micro-batch of `calls`, in order, as one call a step would,
    from one read-back of the last call's loss ring."""
    if not calls:
        return
    ring = ring_losses(calls[-1].ring)
    size = ring.shape[0]
    for call in calls:
        reported = call.reported
        terms, stats = reported.terms, reported.stats
        count = len(call.batches)
        if (
            not terms
            and not stats
            and reported.outputs is None
            and not (
                log.logging
                and (call.first + count // accum) // log.every > call.first // log.every
            )
        ):  # losses only, no train line: settled together
            at = (call.first * accum + np.arange(count)) % size
            if log.settle_losses(ring[at].tolist()):
                continue
        outputs = None if reported.outputs is None else jax.device_get(reported.outputs)
        for j, (host, index) in enumerate(call.batches):
            step, micro = divmod(j, accum)
            at = (step,) if accum == 1 else (step, micro)
            ends = micro == accum - 1
            log.settle(
                InFlight(
                    ring[((call.first + step) * accum + micro) % size],
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
        if stats and log.logging:  # for the epoch's means: once a call, unread
            log.means.add_call(stats, len(call.batches) // accum, accum)
    log.show_latest()


def call_steps(
    context: EpochContext,
    epoch: int,
    feed: Any,
    log: EpochLog,
    skip: int = 0,
    events: StepEvents | None = None,
    agreement: StopAgreement | None = None,
) -> int | None:
    """The hot loop of one epoch in calls, from the state `context.current()`
    holds: the state reached is committed (`context.commit`) on every exit, a
    raising one included (its buffers were donated); returns how many batches the
    feed delivered, or None when a stop or an event ended the epoch.

    Across processes (`agreement` given) every rank stops at the same step: a call
    ends at each agreement point (`agreement.next_at`), where every rank votes, and
    the stop check reads the agreed flag."""
    per_call = context.steps_per_call
    accum = context.accum
    seed = context.seed
    prepared = context.prepared
    names = prepared.routing.train_fields
    expected = prepared.routing.train_batch
    assert expected is not None
    plan = prepared.plan
    assert plan is not None
    source = context.source
    bar = context.bar
    status = context.stops  # the process's own stop request
    autolog = context.autolog_schedules and log.logging
    every = log.every
    on_device = feeds.stages_on_device()  # read here: a test may stand it in
    across_processes = jax.process_count() > 1
    fields = prepared.routing.gradient_fields  # None in manual mode
    host_outputs = fields is not None and fields.host_outputs
    # Without varying schedules every block takes the same step inputs.
    constant = plan.is_constant and not prepared.device_schedules
    # The placed step inputs: (device values, the block's first step, inputs).
    made: tuple[Any, int | None, CallInputs] | None = None
    program: Any = None
    start = context.current()
    step = start.step
    placement = prepared.ctx.placement
    # Where a block goes: split along its batch axis over the run's mesh.
    block_sharding = None if placement is None else placement.block_sharding(accum)
    # Packed only on one device: a flat buffer would undo the mesh's layout.
    packing, carry = _carry_in(start, packs_state() and placement is None)
    ring: Any = None
    size = 0  # the block's steps, fixed by the epoch's first batch
    positions: tuple[Any, ...] = ()
    count: int | None = None  # the epoch's batch count, read once its plan is drawn
    signature: Any = None
    unread: list[_Call] = []  # dispatched, losses not read back yet
    unread_micro = 0
    settle_at = SETTLE_EVERY  # unread micro-batches that force a read
    due = False  # the last call's ring is being copied: read after the next call
    last_read = time.perf_counter()
    delivered: int | None = 0
    profiler = context.profiler
    event = NEVER if events is None else events.next_after(step)
    stops: Any = status if agreement is None else agreement  # what the check reads
    agree_at = NEVER if agreement is None else agreement.next_at
    reached: Any = None  # the state the epoch ended in, once unpacked
    steady: tuple[float, int] | None = None  # (time, step) after the first call
    event_seconds = 0.0  # spent in mid-epoch events since then

    def read_all() -> None:
        nonlocal unread, unread_micro, last_read, due
        _settle(log, unread, accum)
        unread, unread_micro, due = [], 0, False
        last_read = time.perf_counter()

    def read_but_last() -> None:
        # The calls before the one just dispatched: the device keeps that one queued.
        nonlocal unread, unread_micro, last_read, due
        done, unread = unread[:-1], unread[-1:]
        _settle(log, done, accum)
        unread_micro = len(unread[0].batches) if unread else 0
        due = False
        last_read = time.perf_counter()

    def blocks() -> Any:
        """`(pending, steps, stacked batches)` for each block of the epoch; a
        source that ends mid-block yields the whole steps it delivered."""
        nonlocal count, signature, size, positions, settle_at, ring, delivered, made
        reading: list[tuple[dict[str, Any], dict[str, Any], int]] = []
        block = 0
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
                    Accumulation(accum).refuse_epoch(len(source), epoch)
                count = len(source)
                signature = batch_signature(routed)
                size = block_steps(per_call, host_bytes(routed) * accum)
                if per_call == 1 and (
                    not on_device or host_bytes(routed) * accum >= DIRECT_BATCH_BYTES
                ):
                    # The executable takes each host batch as it is (a view) and
                    # transfers it itself: on a CPU a block buys nothing, and a
                    # large batch's stack costs more than the transfers it saves.
                    size = 1
                positions = _positions(size, placement)
                settle_at = max(
                    per_call * accum,
                    min(SETTLE_EVERY, SETTLE_HOST_BYTES // max(host_bytes(full), 1)),
                )
                # Room for what may stay unread, and the calls dispatched meanwhile.
                losses = max(TALLY_SIZE, 4 * (settle_at + size * accum))
                ring = _ring(seed, step, losses, placement)
                held = _CARRIED.get("inputs")
                if (
                    constant
                    and held is not None
                    and held[0] is plan
                    and held[1] is context.device_values()
                    and held[2] == size
                ):
                    made = (held[1], None, held[3])
            if not reading:
                block = min(size, max((count - index) // accum, 1))
            reading.append((full, routed, index))
            delivered = index + 1
            if len(reading) == block * accum:
                yield reading, block, _staged(reading, block)
                reading = []
        whole = len(reading) // accum  # a source that ran short: its whole steps
        if whole:
            reading = reading[: whole * accum]
            yield reading, whole, _staged(reading, whole)

    def _staged(reading: list[Any], block: int) -> dict[str, Any]:
        # Read whole by one call, a block's host arrays go to that call's
        # executable, which places them itself (a separate transfer cost a TPU host
        # a dispatch, 100-170 us a block). Read by several calls (steps_per_call
        # below the block, an event or agreement point inside it) it is placed
        # once, without waiting for the copy: the call that reads it waits on the
        # device, and waiting here would drain the device's queue every block. A
        # block cut short is padded: on an accelerator on the device, so that its
        # copy carries only its own batches. Across processes every block is
        # assembled from each process's rows.
        several = per_call < block or min(event, agree_at) - step < block
        short = block < size
        placed = several or (short and on_device) or across_processes
        routed = [r for _, r, _ in reading]
        try:
            batches = stacked_block(routed, block, accum, size, pad_host=not placed)
        except ValueError:  # fields of several shapes do not stack
            refuse_changed(reading, signature, epoch)
            raise
        if not placed:
            return batches
        return transfer(batches, block_sharding, wait=False, rows=size)

    try:
        for pending, block, batches in blocks():
            done_in_block = 0
            while done_in_block < block:
                until = min(event, agree_at) - step  # a call ends at each
                length = call_length(per_call, block - done_in_block, until)
                if profiler is not None:
                    for at in range(step, step + length):
                        profiler.at_step(at, carry[0])
                device = context.device_values()  # set_device may replace it
                block_first = step - done_in_block
                if (
                    made is None
                    or made[0] is not device
                    or made[1] not in (None, block_first)
                ):
                    inputs = call_inputs(
                        prepared, plan, device, block_first, block, size, placement
                    )
                    # Without varying schedules one placed copy serves every block.
                    made = (device, None if constant else block_first, inputs)
                    if constant:
                        _CARRIED["inputs"] = (plan, device, size, inputs)
                inputs = made[2]
                args = TrainCallArgs(
                    inputs.values_shared,
                    inputs.values_steps,
                    *carry,
                    batches,
                    inputs.hp_shared,
                    inputs.hp_steps,
                    positions[done_in_block],
                    positions[length],
                    ring,
                )
                if program is None:  # the epoch's first call
                    # (Its batches need no check against the signature: they were
                    # stacked, which refuses a changed shape or dtype, or it is the
                    # one batch the signature was read from.)
                    program = log.program = call_program(
                        context,
                        args,
                        inputs,
                        single=per_call == 1,
                        packing=packing,
                    )
                try:
                    first_arg, second, third, reported, ring = program(*args)
                    carry = (first_arg, second, third)
                except TypeError:  # an executable refusing its arguments: no step ran
                    refuse_changed(pending, signature, epoch)
                    raise
                first_micro = done_in_block * accum
                micro = pending[first_micro : first_micro + length * accum]
                row = done_in_block
                lines = [
                    plan.scheduled_log(inputs.schedule_values[row + i])
                    if autolog and (step + i + 1) % every == 0
                    else None
                    for i in range(length)
                ]
                logged = log.logging and (step + length) // every > step // every
                call = _Call(
                    reported, step, [(f, at) for f, _, at in micro], lines, ring
                )
                step += length
                done_in_block += length
                if steady is None:  # the steps from here on time the loop itself
                    steady = (time.perf_counter(), step)
                advance_progress_counter(length)
                if bar is not None:  # the call's micro-batches, in one event
                    bar.steps(len(micro))
                for _, batch, _ in micro:
                    feed.release(batch)
                unread.append(call)
                unread_micro += length * accum
                if due:  # the previous call's ring was asked for: read it now
                    read_but_last()
                due = (
                    logged  # its train line
                    or host_outputs  # train_metrics on the host: every micro-batch
                    or unread_micro + per_call * accum >= settle_at
                    or (
                        bar is not None
                        and time.perf_counter() - last_read > BAR_SECONDS
                    )
                )
                if due or (done_in_block == block and delivered == count):
                    # Read after the next call, or the epoch's last call, read once
                    # it is done: its copy starts now (a blocking read of a fresh
                    # result cost a TPU host about 250 us more).
                    ring.copy_to_host_async()
                if step >= agree_at:  # across processes: every rank votes here
                    assert agreement is not None
                    agree_at = agreement.vote(
                        step, status.stop_requested, status.preempted
                    )
                if step >= event:  # calls end at events: only a step-based run's
                    assert events is not None
                    read_all()
                    context.commit(_carry_out(start, carry, step, packing))
                    committed = _state_trees(context.current())
                    fired = time.perf_counter()
                    leave = events.fire(step, log)
                    event_seconds += time.perf_counter() - fired
                    event = events.next_after(step)
                    made = None  # a validation may have moved a Plateau's rate
                    now = context.current()  # the events only read it
                    if not _same(_state_trees(now), committed):
                        packing, carry = _carry_in(now, packing is not None)
                    if leave:
                        delivered = None
                        break
                if stops.stop_requested:
                    delivered = None
                    break
            if delivered is None:
                break
        # The state unpacked before the last losses are read: the device runs the
        # unpack while the host waits for them.
        reached = _carry_out(start, carry, step, packing)
        read_all()
        if steady is not None and step > steady[1]:
            elapsed = time.perf_counter() - steady[0] - event_seconds
            log.steady_step_seconds = elapsed / (step - steady[1])
    finally:
        if reached is None:  # left early: by a stop, an event or an error
            reached = _carry_out(start, carry, step, packing)
        context.commit(reached)
        if packing is not None:  # the next epoch starts from these flat buffers
            held = _state_trees(context.current())
            _CARRIED["packed"] = (packing, held, carry)
        if ring is not None:
            losses = ring.shape[0] - RING_HEAD
            _CARRIED["ring"] = ((seed % 2**32, step, losses), ring)
    return delivered
