"""The hot loop: calls of one to K optimizer steps.

Every run trains here: the automatic mode and manual mode (the experiment's own
`train_step` as the program's step), on one device or a mesh (a block split along
its batch axis), in one process or several (each rank stacks its own rows; a call
ends at every agreement point, where the ranks vote on a stop).

The loop runs calls of the train program (`compile/scanned.py`) over blocks: the
batches of up to K steps, stacked with one `np.stack` per field (`assembly.py`). A
pass with threads of its own hands the loop its blocks already stacked, and on an
accelerator placed, by its in-order thread; a pass read here (a list of built
batches, `NoPrefetch`, a CPU at one step a call, a run across processes) is grouped
and stacked by the loop, and a block read by one call goes to its executable as
host arrays, one read by several is placed once (`_staged`). Calls are
`steps_per_call` steps, cut short at the epoch's end and at the next step event.
One program serves every call length, so steps_per_call=1 is a call of length 1 of
this same loop, and a run compiles one train program (at steps_per_call=1 one
without the loop around its step, which cost a CPU step about 10%). At
steps_per_call=1 a large batch is a block of its own, handed to the executable as a
view of the host arrays (`blocks.DIRECT_BATCH_BYTES`, less on a CPU backend).

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
about 400 us). Settling goes through `EpochLog` as if each step were read alone (the
steps of calls that carry only losses in one pass, but a logged step's, which
writes its train line; other calls micro-batch by micro-batch): the
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
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

import jax

from ..compile.compile_clock import compile_seconds
from ..compile.packed import pack_rule
from ..compile.scanned import TrainCallArgs
from ..data.transfer import transfer
from ..devices.agreement import StopAgreement
from ..observe.counter import advance_progress_counter
from . import feed as feeds
from .assembly import Block, BlockAssembler, BlockSettings, PassEnd
from .blocks import host_bytes, refuse_changed, stacked_block
from .cadence import NEVER
from .carried import (
    carried_inputs,
    carried_positions,
    carried_ring,
    carry_in,
    carry_out,
    hold_inputs,
    hold_ring,
    hold_state,
    same_trees,
    state_trees,
    unpacks_at_once,
)
from .context import EpochContext
from .epoch_log import EpochLog, StepEvents
from .settling import UnreadCall, settle_calls
from .step_programs import (
    CallInputs,
    call_inputs,
    call_program,
)

if TYPE_CHECKING:
    from ..optim.plan import OptimizerPlan

TALLY_SIZE = 512
"""Micro-batch losses the device ring holds (float32)."""
SETTLE_EVERY = 256
"""The most micro-batches the loop leaves unread: the divergence check's latency."""
SETTLE_HOST_BYTES = 64 * 2**20
"""The most host-batch bytes the unread micro-batches may hold (kept for a
divergence message); fewer micro-batches are left unread where they are large."""
BAR_SECONDS = 0.25
"""How often the progress bar's loss is refreshed (a read-back each time)."""


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


def call_steps(
    context: EpochContext,
    epoch: int,
    feed: Any,
    log: EpochLog,
    assembler: BlockAssembler,
    events: StepEvents | None = None,
    agreement: StopAgreement | None = None,
    *,
    read_ahead: ReadAheadPlan | None = None,
) -> int | None:
    """The hot loop of one epoch in calls, from the state `context.current()`
    holds: the state reached is committed (`context.commit`) on every exit, a
    raising one included (its buffers were donated); returns how many batches the
    feed delivered, or None when a stop or an event ended the epoch.

    `assembler` groups the feed's batches into blocks (`assembly.py`): the feed's
    own thread ran it when it `stages`, else the loop runs it on the feed's items.
    Across processes (`agreement` given) every rank stops at the same step: a call
    ends at each agreement point (`agreement.next_at`), where every rank votes, and
    the stop check reads the agreed flag. `read_ahead`: the epoch's first items
    read ahead by the epoch before (`read_ahead.py`), and what to read ahead for
    the next once this epoch's last call is dispatched."""
    return _EpochCalls(
        context, epoch, feed, log, assembler, events, agreement, read_ahead
    ).run()


class ReadAheadPlan(NamedTuple):
    """The calls loop's side of reading ahead (`read_ahead.py`): the items this
    epoch's pass had read before it began (ending with a `PassEnd` where they are
    the whole pass), and what stages the next epoch's first block (None: nothing
    to read ahead)."""

    items: list[Block | PassEnd]
    next_epoch: Callable[[], None] | None


def epoch_assembler(
    context: EpochContext, epoch: int, skip: int, threads: bool
) -> BlockAssembler:
    """The assembler of epoch `epoch`'s blocks, `skip` batches already trained;
    `threads`: the pass runs threads of its own (`feed.threads_assemble`). Its
    in-order thread assembles, stacks and places the blocks where blocks hold
    several batches or go to an accelerator, in one process; the loop assembles
    them where a block is one host batch handed to the executable as it is (a CPU
    at one step a call: a thread would add a hand-off a step), and across
    processes, where every rank assembles its blocks in step with the others."""
    prepared, placement = context.prepared, context.prepared.ctx.placement
    on_device = feeds.stages_on_device()
    expected = prepared.routing.train_batch
    assert expected is not None
    settings = BlockSettings(
        fields=prepared.routing.train_fields,
        expected=expected,
        epoch=epoch,
        skip=skip,
        accum=context.accum,
        per_call=context.steps_per_call,
        on_device=on_device,
        sharding=None if placement is None else placement.block_sharding(context.accum),
    )
    stages = (
        threads
        and jax.process_count() == 1
        and (on_device or context.steps_per_call > 1 or context.accum > 1)
    )
    return BlockAssembler(settings, context.source, stages, context.host_buffers)


class _EpochCalls:
    """One epoch's calls: what the loop keeps from one call to the next (the state
    it carries, the blocks' plan, the calls not read back yet)."""

    def __init__(
        self,
        context: EpochContext,
        epoch: int,
        feed: Any,
        log: EpochLog,
        assembler: BlockAssembler,
        events: StepEvents | None,
        agreement: StopAgreement | None,
        read_ahead: ReadAheadPlan | None = None,
    ) -> None:
        self.context, self.epoch, self.feed, self.log = context, epoch, feed, log
        self.read_ahead = read_ahead
        self.assembler, self.events, self.agreement = assembler, events, agreement
        self.skip = assembler.settings.skip
        self.per_call = context.steps_per_call
        self.accum = context.accum
        prepared = self.prepared = context.prepared
        plan = prepared.plan
        assert plan is not None
        self.plan: OptimizerPlan = plan
        self.bar = context.bar
        self.status = context.stops  # the process's own stop request
        # What the stop check reads: across processes, the agreed flag.
        self.stops: Any = self.status if agreement is None else agreement
        self.autolog = context.autolog_schedules and log.logging
        self.on_device = assembler.settings.on_device
        self.across_processes = jax.process_count() > 1
        fields = prepared.routing.gradient_fields  # None in manual mode
        self.host_outputs = fields is not None and fields.host_outputs
        # Without varying schedules every block takes the same step inputs.
        self.constant = plan.is_constant and not prepared.device_schedules
        self.placement = placement = prepared.ctx.placement
        # Where a block goes: split along its batch axis over the run's mesh.
        self.block_sharding = assembler.settings.sharding
        self.start = context.current()
        self.step = self.start.step
        # Packed only on one device: a flat buffer would undo the mesh's layout.
        self.pack_rule = pack_rule() if placement is None else None
        self.packing, self.carry = carry_in(
            self.start, self.pack_rule, context.programs
        )
        self.program: Any = None  # the train program, found at the first call
        # The placed step inputs: (device values, the block's first step, inputs).
        self.made: tuple[Any, int | None, CallInputs] | None = None
        # The blocks' plan, drawn at the epoch's first block.
        self.count: int | None = None  # the epoch's batch count
        self.signature: Any = None
        self.size = 0  # the steps a block holds
        self.positions: tuple[Any, ...] = ()
        self.ring: Any = None
        self.copies_ring = True  # the ring lives off the host: a read copies it
        self.settle_at = SETTLE_EVERY  # unread micro-batches that force a read
        self.unread: list[UnreadCall] = []  # dispatched, losses not read back yet
        self.unread_micro = 0
        # Dispatched micro-batches the progress bar has yet to count: it counts
        # them at each read (a few times a second with a bar), not call by call.
        self.unshown = 0
        self.due = False  # the last call's ring is being copied: read after the next
        self.last_read = time.perf_counter()
        self.delivered: int | None = 0
        self.event = NEVER if events is None else events.next_after(self.step)
        self.agree_at = NEVER if agreement is None else agreement.next_at
        # (time, step, compile seconds) after call 1: the loop's own step time is
        # timed from there, without mid-epoch events nor the programs compiled.
        self.steady: tuple[float, int, float] | None = None
        self.event_seconds = 0.0  # spent in mid-epoch events since, but compiling

    def run(self) -> int | None:
        """Train the epoch's blocks call by call; commit the state reached."""
        reached: Any = None  # the state the epoch ended in, once unpacked
        try:
            for block in self._blocks():
                batches = self._staged(block)
                done_in_block = 0
                while done_in_block < block.steps:
                    done_in_block += self._call(block, batches, done_in_block)
                    if self._leaves():
                        self.delivered = None
                        break
                if self.delivered is None:
                    break
                self._release(block)
            # The state unpacked before the last losses are read: the device runs
            # the unpack while the host waits for them. Not while its program has
            # yet to compile (a process's first epoch): the compile would hold the
            # losses back, in a one-step epoch the first step's.
            if unpacks_at_once(self.packing):
                reached = carry_out(self.start, self.carry, self.step, self.packing)
            reader = None if self.read_ahead is None else self.read_ahead.next_epoch
            if self.delivered is not None and reader is not None:
                reader()  # the next epoch's first block, while the device works
            self._read_all()
            self._time_steady()
        finally:
            if reached is None:  # left early (a stop, an event, an error), or unpacked
                reached = carry_out(self.start, self.carry, self.step, self.packing)
            self._leave_for_the_next_epoch(reached)
        return self.delivered

    def _blocks(self) -> Iterator[Block]:
        """The epoch's blocks in order (a source that ends mid-block: the whole
        steps it delivered), counting the batches delivered."""
        for item in self._assembled():
            if isinstance(item, PassEnd):
                self._delivered_to(item.delivered)
                continue
            self._delivered_to(item.delivered - len(item.batches))
            self.delivered = item.delivered
            if self.count is None:  # the epoch's first block
                self._draw_plan(item)
            yield item

    def _assembled(self) -> Iterator[Block | PassEnd]:
        """The feed's blocks: as its thread assembled them, or assembled here
        (after those read ahead by the epoch before)."""
        feed, assembler = self.feed, self.assembler
        ahead = [] if self.read_ahead is None else self.read_ahead.items
        yield from ahead
        if ahead and isinstance(ahead[-1], PassEnd):  # the whole pass, read ahead
            return
        if assembler.stages:
            yield from feed
            return
        skip = self.skip
        for full, routed in feed:
            block = assembler.add(full, routed)
            if block is not None:
                yield block
            elif assembler.index <= skip:  # passed over: nothing holds it
                feed.release(routed)
        yield from assembler.finish()

    def _delivered_to(self, delivered: int) -> None:
        """The feed delivered `delivered` batches: the progress bar steps over the
        ones passed over (trained before a stop)."""
        assert self.delivered is not None
        skipped = max(0, min(delivered, self.skip) - self.delivered)
        if skipped and self.bar is not None:
            self.bar.steps(skipped)
        self.delivered = delivered

    def _draw_plan(self, block: Block) -> None:
        """The calls' side of the blocks' plan, from the epoch's first block: the
        block positions, the loss ring, the placed step inputs."""
        accum, per_call, placement = self.accum, self.per_call, self.placement
        plan = block.plan
        self.count, self.signature, self.size = plan.count, plan.signature, plan.size
        size = plan.size
        self.positions = carried_positions(size, placement)
        self.settle_at = max(
            per_call * accum,
            min(
                SETTLE_EVERY,
                SETTLE_HOST_BYTES // max(host_bytes(block.batches[0][0]), 1),
            ),
        )
        # Room for what may stay unread, and the calls dispatched meanwhile.
        losses = max(TALLY_SIZE, 4 * (self.settle_at + size * accum))
        self.ring = carried_ring(self.context.seed, self.step, losses, placement)
        # A ring in host memory (the CPU backend) is read where it is: starting its
        # copy to the host would only cost the call (about 4 us on a CPU).
        self.copies_ring = any(d.platform != "cpu" for d in self.ring.devices())
        device = self.context.device_values()
        held = carried_inputs(self.plan, device, size) if self.constant else None
        if held is not None:
            self.made = (device, None, held)

    def _staged(self, block: Block) -> dict[str, Any]:
        """A block's batches stacked (unless the feed's thread stacked them), placed
        where several calls read it."""
        # Read whole by one call, a block's host arrays go to that call's
        # executable, which places them itself (a separate transfer cost a TPU host
        # a dispatch, 100-170 us a block). Read by several calls (steps_per_call
        # below the block, an event or agreement point inside it) it is placed
        # once, without waiting for the copy: the call that reads it waits on the
        # device, and waiting here would drain the device's queue every block. A
        # block cut short is padded: on an accelerator on the device, so that its
        # copy carries only its own batches. Across processes every block is
        # assembled from each process's rows.
        size, steps = self.size, block.steps
        several = (
            self.per_call < steps or min(self.event, self.agree_at) - self.step < steps
        )
        stacked = block.stacked
        if stacked is not None:  # on an accelerator placed there, else padded
            if self.on_device or not several:
                return stacked
            return transfer(stacked, self.block_sharding)
        short = steps < size
        placed = several or (short and self.on_device) or self.across_processes
        routed = [r for _, r, _ in block.batches]
        try:
            batches = stacked_block(
                routed,
                steps,
                self.accum,
                size,
                pad_host=not placed,
                buffers=self.context.host_buffers,
            )
        except ValueError:  # fields of several shapes do not stack
            refuse_changed(block.batches, self.signature, self.epoch)
            raise
        if not placed:
            return batches
        return transfer(batches, self.block_sharding, rows=size)

    def _release(self, block: Block) -> None:
        """A block whose last call is dispatched: what the feed staged for it is
        freed (and its producers woken)."""
        if block.stacked is not None:
            self.feed.release(block.stacked)
            return
        for _, routed, _ in block.batches:
            self.feed.release(routed)

    def _inputs(self, block: int, block_first: int) -> CallInputs:
        """The step inputs of a block's calls, placed again only when the Device
        values, or the block under varying schedules, changed."""
        device = self.context.device_values()  # set_device may replace it
        made = self.made
        if made is None or made[0] is not device or made[1] not in (None, block_first):
            inputs = call_inputs(
                self.prepared,
                self.plan,
                device,
                block_first,
                block,
                self.size,
                self.placement,
            )
            # Without varying schedules one placed copy serves every block.
            made = self.made = (device, None if self.constant else block_first, inputs)
            if self.constant:
                hold_inputs(self.plan, device, self.size, inputs)
        return made[2]

    def _call(self, block: Block, batches: Any, done_in_block: int) -> int:
        """Dispatch the next call over the block; returns its steps."""
        step, accum = self.step, self.accum
        until = min(self.event, self.agree_at) - step  # a call ends at each
        length = call_length(self.per_call, block.steps - done_in_block, until)
        profiler = self.context.profiler
        if profiler is not None:
            for at in range(step, step + length):
                profiler.at_step(at, self.carry[0])
        inputs = self._inputs(block.steps, step - done_in_block)
        args = (  # a TrainCallArgs's fields (a plain tuple costs a call less)
            inputs.values_shared,
            inputs.values_steps,
            *self.carry,
            batches,
            inputs.hp_shared,
            inputs.hp_steps,
            self.positions[done_in_block],
            self.positions[length],
            self.ring,
        )
        if self.program is None:  # the epoch's first call
            # (Its batches need no check against the signature: they were stacked,
            # which refuses a changed shape or dtype, or it is the one batch the
            # signature was read from.) Packed around each step, one-step calls
            # take the loop's program too, for the same bits (`compile/packed.py`).
            each_step = self.packing is not None and self.packing.each_step
            self.program = self.log.program = call_program(
                self.context,
                TrainCallArgs(*args),
                inputs,
                single=self.per_call == 1 and not each_step,
                packing=self.packing,
            )
        try:
            first_arg, second, third, reported, self.ring = self.program(*args)
            self.carry = (first_arg, second, third)
        except TypeError:  # an executable refusing its arguments: no step ran
            refuse_changed(block.batches, self.signature, self.epoch)
            raise
        first_micro = done_in_block * accum
        micro = block.batches[first_micro : first_micro + length * accum]
        every = self.log.every
        logged = self.log.logging and (step + length) // every > step // every
        lines = None  # the schedules' values on the call's logged steps
        if logged and self.autolog:
            lines = [
                self.plan.scheduled_log(inputs.schedule_values[done_in_block + i])
                if (step + i + 1) % every == 0
                else None
                for i in range(length)
            ]
        self.unread.append(UnreadCall(reported, step, micro, lines, self.ring))
        self.step = step + length
        if self.steady is None:  # the steps from here on time the loop itself
            self.steady = (time.perf_counter(), self.step, compile_seconds())
        advance_progress_counter(length)
        self.unshown += len(micro)
        self.unread_micro += length * accum
        last = done_in_block + length == block.steps and self.delivered == self.count
        self._plan_read(logged, last)
        return length

    def _plan_read(self, logged: bool, last: bool) -> None:
        """Read back what the call before this one left, if it was asked for, and
        ask for this one's when something will need it (`logged`: its train line;
        `last`: the epoch's last call)."""
        if self.due:  # the previous call's ring was asked for: read it now
            self._read_but_last()
        self.due = (
            logged  # its train line
            or self.host_outputs  # train_metrics on the host: every micro-batch
            or self.unread_micro + self.per_call * self.accum >= self.settle_at
            or (
                self.bar is not None
                and time.perf_counter() - self.last_read > BAR_SECONDS
            )
        )
        if (self.due or last) and self.copies_ring:
            # Read after the next call, or the epoch's last call, read once it is
            # done: its copy starts now (a blocking read of a fresh result cost a
            # TPU host about 250 us more).
            self.ring.copy_to_host_async()

    def _leaves(self) -> bool:
        """After a call: the ranks' vote at an agreement point, the events of the
        step reached; True when the epoch ends here (an event or a stop)."""
        step = self.step
        if step >= self.agree_at:  # across processes: every rank votes here
            assert self.agreement is not None
            self.agree_at = self.agreement.vote(
                step, self.status.stop_requested, self.status.preempted
            )
        if step >= self.event and self._fire_events():
            return True
        return bool(self.stops.stop_requested)

    def _fire_events(self) -> bool:
        """The step events at this step (a step-based run's validation,
        checkpoint, max_steps), with the state they read committed; True: leave
        the epoch here."""
        events, context = self.events, self.context
        assert events is not None
        self._read_all()
        context.commit(carry_out(self.start, self.carry, self.step, self.packing))
        committed = state_trees(context.current())
        fired, compiled = time.perf_counter(), compile_seconds()
        leave = events.fire(self.step, self.log)
        self.event_seconds += time.perf_counter() - fired
        self.event_seconds -= compile_seconds() - compiled  # counted with the rest
        self.event = events.next_after(self.step)
        self.made = None  # a validation may have moved a Plateau's rate
        now = context.current()  # the events only read it
        if not same_trees(state_trees(now), committed):
            rule = self.pack_rule if self.packing is not None else None
            self.packing, self.carry = carry_in(now, rule, self.context.programs)
        return leave

    def _read_all(self) -> None:
        settle_calls(self.log, self.unread, self.accum)
        self._show_progress()
        self.unread, self.unread_micro, self.due = [], 0, False
        self.last_read = time.perf_counter()

    def _read_but_last(self) -> None:
        # The calls before the one just dispatched: the device keeps that one queued.
        done, self.unread = self.unread[:-1], self.unread[-1:]
        settle_calls(self.log, done, self.accum)
        self._show_progress()
        self.unread_micro = len(self.unread[0].batches) if self.unread else 0
        self.due = False
        self.last_read = time.perf_counter()

    def _show_progress(self) -> None:
        """The micro-batches dispatched since the last read, on the progress bar
        in one event."""
        if self.unshown and self.bar is not None:
            self.bar.steps(self.unshown)
        self.unshown = 0

    def _time_steady(self) -> None:
        """The epoch's step time after its first call, for steps_per_call="auto"
        (`EpochLog.steady_step_seconds`), without the host's time in mid-epoch
        events and in compiling (`compile_clock.py`: in a process's first epoch the
        small programs the loop meets first compile inside it)."""
        if self.steady is not None and self.step > self.steady[1]:
            started, step, compiled = self.steady
            elapsed = time.perf_counter() - started - self.event_seconds
            elapsed -= compile_seconds() - compiled
            self.log.steady_step_seconds = max(elapsed, 0.0) / (self.step - step)

    def _leave_for_the_next_epoch(self, reached: Any) -> None:
        """Commit the state `reached`; keep the flat buffers and the ring it left
        for the next epoch (`CARRIED`)."""
        context = self.context
        context.commit(reached)
        hold_state(
            self.pack_rule,
            self.packing,
            context.current(),
            self.carry,
            context.programs,
        )
        if self.ring is not None:
            hold_ring(context.seed, self.step, self.ring)
