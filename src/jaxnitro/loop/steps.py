"""One training epoch: the feed, then the hot loop that fits the run.

In the automatic mode on one device in one process the epoch runs `calls.call_steps`:
blocks of batches staged with one transfer, calls of 1 to K steps of one program, no
loss read back per step. On a mesh, across processes and in manual mode it runs
`_steps` here, one program a micro-batch (their programs lay their arguments out over
devices; folding them into the calls loop is the next step): with accum == 1 each
batch runs one fused train_step program; with accum > 1 each micro-batch runs the
gradient program, and every accum-th the optimizer program. That loop reads back the
PREVIOUS micro-batch's loss: the device runs ahead by one micro-batch while the host
waits. A non-finite loss raises naming its step and epoch, and whether the batch's
inputs were already non-finite. `EpochLog` (`epoch_log.py`) settles both loops'
steps alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp

from ..data.signature import Signature, batch_signature, changed_field
from ..devices.agreement import StopAgreement
from ..errors import ConfigError
from ..experiment.rng import step_rng_input
from ..logging import protocol as logproto
from ..observe.counter import advance_progress_counter
from ..optim.schedules import Target
from .cadence import NEVER
from .calls import call_steps, runs_in_calls
from .epoch_log import EpochLog, InFlight, StepEvents
from .feed import open_feed
from .step_programs import (
    check_batch,
    check_epoch_count,
    current_state,
    device_inputs,
    training_programs,
)

if TYPE_CHECKING:
    from ..run.handle import Nitro
    from ..run.state import TrainState


def run_epoch(
    nitro: Nitro,
    epoch: int,
    *,
    skip: int = 0,
    carried: tuple[float, int] = (0.0, 0),
    events: StepEvents | None = None,
    agreement: StopAgreement | None = None,
) -> EpochLog:
    """One epoch of micro-batches from the train split's feed; closed on every exit.

    It trains from `nitro.train_state` and commits the new state to the handle on
    every exit, a raising one included (the old one's buffers were donated).
    `skip`: batches a stopped run already trained this epoch; they are read (so the
    epoch's order and the source's state stay as they were) and passed over.
    `carried`: their running loss sum and count, which the epoch's mean continues.
    `events`: called after each optimizer step it places an event on (mid-epoch
    validation and checkpoints, max_steps); it may end the epoch there.
    `agreement`: across processes, the stop every rank agrees on, which the loop
    reads instead of the process's own request (None in one process).
    """
    log = EpochLog(nitro, epoch, carried, skip)
    in_calls = runs_in_calls(nitro)
    source = nitro.data["train"]
    bar = nitro.progress()
    if bar is not None:
        max_epochs = nitro.config.max_epochs
        bar.begin("train", len(source), epoch=epoch, max_epochs=max_epochs)
    feed = open_feed(
        source,
        epoch=epoch - 1,
        fields=nitro.prepared.routing.train_fields,
        name="train",
        placement=nitro.prepared.ctx.placement,
        stage=not in_calls,  # the calls loop stacks a block's batches, then places it
    )
    log.feed = feed
    accum = nitro.config.accum
    try:
        if in_calls:
            delivered = call_steps(
                nitro, epoch, feed, log, bar, skip, events, agreement
            )
        else:
            delivered = _steps(nitro, epoch, feed, log, bar, skip, events, agreement)
    except BaseException:
        if accum > 1:  # it may have raised partway through an optimizer step
            nitro.commit_state(_zeroed_accumulator(nitro.train_state))
        raise
    finally:
        feed.close()
    logproto.flush(nitro.logger)  # the epoch's train lines, before validation runs
    if delivered is not None:
        if delivered % accum:  # a source that ran short or long ended mid-step
            nitro.commit_state(_zeroed_accumulator(nitro.train_state))
        _check_epoch_length(source, delivered, epoch)
    return log


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


def _steps(
    nitro: Nitro,
    epoch: int,
    feed: Any,
    log: EpochLog,
    bar: Any,
    skip: int = 0,
    events: StepEvents | None = None,
    agreement: StopAgreement | None = None,
) -> int | None:
    """The hot loop. Every attribute it reads per step is bound to a local first;
    the per-step work is the dispatch plus one read-back. The training state lives
    in locals here (its parts are donated to each step) and is committed to the
    handle on every exit.

    At a step `events` places an event on (one integer compare per step finds it)
    the in-flight micro-batch is read back and the state committed first, so the
    events see the state after that step.

    Across processes (`agreement` given) every rank stops at the same step: the
    stop check reads the agreed flag, which changes only at the agreement points
    every rank votes at (`agreement.next_at`; one integer compare per step finds
    them, and in one process it never matches).

    Returns how many batches the feed delivered, or None when a stop request, an
    event or max_steps ended the epoch early."""
    accum = nitro.config.accum
    seed = nitro.config.seed
    names = nitro.prepared.routing.train_fields
    expected = nitro.prepared.routing.train_batch
    assert expected is not None
    # Across processes a staged batch is the global one: every process's rows.
    expected *= jax.process_count()
    plan = nitro.prepared.plan
    assert plan is not None
    # Bound once: the loop reads each of these every step.
    settle = log.settle
    release = feed.release
    device_values = nitro.device_values
    bar_step = None if bar is None else bar.step
    autolog = nitro.config.autolog_schedules and log.logging
    every = log.every
    gradient: Any = None
    optimizer: Any = None
    in_flight: InFlight | None = None
    start = nitro.train_state
    weights, model_state = start.weights, start.model_state
    accumulator, step = start.accumulator, start.step
    step_values: dict[Target, float] = {}
    hp: dict[str, Any] = {}
    # While no schedule varies, the plan hands back one constant tree each step; it
    # is placed once, since each host scalar in it costs the executable a transfer
    # per call. On a mesh the executable places its arguments itself (in the same
    # way for a host or a device value), so there the tree stays on the host.
    one_device = nitro.prepared.ctx.placement is None and jax.process_count() == 1
    host_hp: Any = None  # the tree `placed_hp` is a copy of
    placed_hp: Any = None
    device: dict[str, Any] | None = None  # the Device fields `values` was merged from
    values: dict[str, Any] = {}
    signature: Signature = {}
    delivered: int | None = 0
    profiler = nitro.status.profiler  # None unless the run keyword profile= is set
    event = NEVER if events is None else events.next_after(step)
    status = nitro.status  # the process's own stop request and its kind
    stops: Any = status if agreement is None else agreement  # what the check reads
    agree_at = NEVER if agreement is None else agreement.next_at
    try:
        for index, (full, routed) in enumerate(feed):
            check_batch(routed, names, expected, index, epoch)
            if index < skip:  # trained before a stop: this epoch continues after it
                feed.release(routed)
                if bar is not None:
                    bar.step()
                delivered = index + 1
                continue
            if (
                index % accum == 0
            ):  # a new optimizer step: its schedules, evaluated once
                step_values = plan.schedule_values(step)
                fresh = plan.step_inputs(step, step_values)
                if fresh is host_hp and one_device:  # the constant tree again
                    if placed_hp is None:
                        placed_hp = jax.device_put(fresh)
                    hp = placed_hp
                else:
                    hp = host_hp = fresh
                    placed_hp = None
                device = None
                if profiler is not None:
                    profiler.at_step(step, weights)
            rng = step_rng_input(seed, step, index % accum)  # what step_rng() folds
            live = device_values()  # set_device may replace it between steps
            if live is not device:
                device = live
                values = device_inputs(nitro, device, step_values)
            if gradient is None:  # the epoch's first trained batch: its plan is drawn
                if accum > 1:
                    check_epoch_count(nitro.data["train"], accum, epoch)
                signature = batch_signature(routed)  # what the programs take
                gradient, optimizer = training_programs(
                    nitro,
                    start._replace(
                        weights=weights,
                        model_state=model_state,
                        accumulator=accumulator,
                    ),
                    routed,
                    values,
                    hp,
                    rng,
                )
            try:
                if accum == 1:
                    weights, model_state, reported = gradient(
                        values, weights, model_state, routed, hp, rng
                    )
                    ends_step = True
                else:
                    accumulator, model_state, reported = gradient(
                        values,
                        weights.params,
                        model_state,
                        accumulator,
                        routed,
                        hp["grad"],
                        rng,
                    )
                    ends_step = (index + 1) % accum == 0
                    if ends_step:
                        weights, accumulator = optimizer(
                            values, weights, accumulator, hp
                        )
            except TypeError:  # an executable refusing its arguments: no step ran
                refusal = changed_field(signature, routed, "train", index, epoch)
                if refusal is not None:
                    raise ConfigError(refusal) from None
                raise
            # Built only for a step whose train line is logged (EpochLog.settle).
            logged = autolog and ends_step and (step + 1) % every == 0
            schedule_line = plan.scheduled_log(step_values) if logged else None
            # The optimizer step this micro-batch belongs to, also when it is not
            # the step's last (a divergence error names it).
            current = InFlight(
                reported.loss,
                reported.terms,
                reported.stats,
                reported.outputs,
                full,
                step + 1,
                index,
                ends_step,
                schedule_line,
            )
            if ends_step:
                step += 1
                advance_progress_counter()
            if bar_step is not None:
                bar_step()
            # The step is dispatched: a staged device batch can go (the runtime frees
            # it when the step has run), which bounds device memory per batch.
            release(routed)
            if in_flight is not None:
                settle(in_flight)
            in_flight = current
            delivered = index + 1
            if ends_step and step >= agree_at:  # across processes: every rank votes
                assert agreement is not None
                agree_at = agreement.vote(step, status.stop_requested, status.preempted)
            if ends_step and step >= event:  # rare: only a step-based run's events
                assert events is not None
                settle(current)
                in_flight = None
                nitro.commit_state(
                    current_state(start, weights, model_state, accumulator, step)
                )
                leave = events.fire(step, log)
                event = events.next_after(step)
                # The events only read the state; the handle's copy is the truth.
                now = nitro.train_state
                weights, model_state = now.weights, now.model_state
                accumulator = now.accumulator
                if leave:
                    delivered = None
                    break
            if ends_step and stops.stop_requested:
                delivered = None
                break
        if in_flight is not None:
            settle(in_flight)
    finally:
        nitro.commit_state(
            current_state(start, weights, model_state, accumulator, step)
        )
    return delivered
