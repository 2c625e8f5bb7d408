"""One training epoch: the hot loop of micro-batches and its host-side bookkeeping.

With accum == 1 each batch runs one fused train_step program; with accum > 1 each
micro-batch runs the gradient program, and every accum-th the optimizer program. Then
the loop reads back the PREVIOUS micro-batch's loss: the device runs ahead by one
micro-batch while the host waits. The batches come from the split's feed (`feed.py`):
routed host arrays on a CPU backend, which the executable places itself (an explicit
`jax.device_put` of the batch dict cost a third of a dispatch-bound step), or device
batches staged ahead by the prefetch stream on an accelerator, released as soon as the
step that uses them is dispatched. A non-finite loss raises naming its step and epoch,
and whether the batch's inputs were already non-finite.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from ..compile.cache import program_cache
from ..compile.programs import gradient_fn, optimizer_fn, train_step_fn
from ..data.finite import describe_nonfinite, nonfinite_fields
from ..data.signature import Signature, batch_signature, changed_field
from ..data.sources import batch_size
from ..errors import ConfigError, DivergenceError
from ..experiment.rng import step_rng_input
from ..logging import protocol as logproto
from ..logging.deferred import DeferredMetrics
from ..observe.counter import advance_progress_counter
from ..optim.plan import scheduled_devices
from ..optim.schedules import Target
from .cadence import NEVER
from .feed import open_feed
from .manual import manual_program

if TYPE_CHECKING:
    from ..run.handle import Nitro
    from ..run.state import TrainState


@dataclass
class _InFlight:
    """A dispatched micro-batch whose loss has not been read back yet."""

    loss: Any
    terms: Any
    stats: Any
    outputs: Any
    host_batch: dict[str, Any]
    step: int
    index: int
    ends_step: bool
    schedule_line: dict[str, float] | None


class EpochLog:
    """The host side of one epoch: read-backs, the divergence check, train lines.

    The epoch's mean loss is a running sum over its micro-batches, in order; a stop
    partway through hands it on (`carried`), so the continued epoch's mean is the
    whole epoch's, bitwise the same as a run never stopped.
    """

    def __init__(
        self,
        nitro: Nitro,
        epoch: int,
        carried: tuple[float, int] = (0.0, 0),
        skip: int = 0,
    ) -> None:
        self.nitro = nitro
        self.epoch = epoch
        self.loss_sum, self.loss_count = carried
        self.trained = skip
        """Batches of the epoch trained so far, those a stopped run trained included."""
        self.step_losses: list[float] = []
        self.step_terms: list[Any] = []  # each micro-batch's loss terms, on the device
        self.check = nitro.config.check_divergence
        self.every = nitro.config.log_every_n_steps
        self.logging = nitro.logger is not None
        self.feed: Any = None  # the epoch's batches, for the time spent waiting
        self.progress = nitro.progress()  # shows the latest train loss

    def settle(self, item: _InFlight) -> None:
        loss = float(item.loss)
        if self.check and not math.isfinite(loss):
            raise DivergenceError(divergence_message(loss, item, self.epoch))
        self.loss_sum += loss
        self.loss_count += 1
        if self.progress is not None:
            self.progress.show({"loss": loss}, throttle=True)
        self.trained += 1
        self.step_losses.append(loss)
        if item.terms:
            self.step_terms.append(item.terms)
        if item.outputs is not None:  # train_metrics on the host: every micro-batch
            item.stats = self._host_train_metrics(item)
            item.outputs = None
        if not item.ends_step:
            return
        if self.logging and item.step % self.every == 0:
            self._log_line(item)
        self.step_losses = []
        self.step_terms = []

    def _log_line(self, item: _InFlight) -> None:
        # The loss terms and device train_metrics stay on the device: the logger
        # reads them back later, with the other lines it holds (logging/deferred.py).
        loss = sum(self.step_losses) / len(self.step_losses)
        line = DeferredMetrics(
            (self.step_terms, item.stats),
            functools.partial(_train_line, loss, item.schedule_line),
        )
        logproto.log_deferred(
            self.nitro.logger, line, step=item.step, epoch=self.epoch, context="train"
        )

    def _host_train_metrics(self, item: _InFlight) -> Any:
        nitro = self.nitro
        names = nitro.prepared.routing.fields["train_metrics"].select(
            tuple(item.host_batch)
        )
        return nitro.prepared.hooks["train_metrics"](
            nitro.experiment,
            jax.device_get(item.outputs),
            **{k: item.host_batch[k] for k in names},
        )

    def mean_loss(self) -> float:
        """The epoch's mean train loss (NaN if it ran no micro-batch)."""
        return self.loss_sum / self.loss_count if self.loss_count else math.nan

    def carried(self) -> tuple[float, int]:
        """The running loss sum and count, for the rest of an epoch a stop cut."""
        return self.loss_sum, self.loss_count


class StepEvents(Protocol):
    """What the hot loop calls at the steps a step-based run places events on
    (`cadence.StepCadence`): validation, a checkpoint, max_steps."""

    def next_after(self, step: int) -> int:
        """The first step after `step` with an event; `cadence.NEVER` for none."""
        ...

    def fire(self, step: int, log: EpochLog) -> bool:
        """Run the events of `step`, the handle holding the state after it and
        `log` every micro-batch up to it; True: leave the epoch here."""
        ...


def divergence_message(loss: float, item: _InFlight, epoch: int) -> str:
    """The divergence error, saying whether the batch's inputs were already
    non-finite: bad data wants fixing, not a lower learning rate. The inputs are
    read only now, so finite batches cost the hot loop nothing."""
    where = (
        f"The training loss is {loss} at step {item.step} of epoch {epoch} (batch "
        f"{item.index} of the epoch)."
    )
    found = nonfinite_fields(item.host_batch)
    if found:
        return (
            f"{where} The batch's inputs were already non-finite "
            f"({describe_nonfinite(found)}): the data, not the optimization, is at "
            f"fault. There is no rollback: fix or filter those samples in the source "
            f"and resume from the last checkpoint."
        )
    return (
        f"{where} The batch's inputs were all finite, so the model diverged. There "
        f"is no rollback: resume from the last checkpoint with a lower learning "
        f"rate, or pass check_divergence=False to continue from the diverged state."
    )


def _train_line(
    loss: float, schedule_line: dict[str, float] | None, fetched: Any
) -> dict[str, Any]:
    """The train line of a step: its mean loss, each loss term averaged over the
    step's micro-batches as the loss is, the train_metrics of its last micro-batch
    (the spec's train line) and the schedule values; `fetched` is `(terms, stats)`
    read back."""
    terms, stats = fetched
    line: dict[str, Any] = {"loss": loss}
    for name in terms[0] if terms else ():
        line[f"loss/{name}"] = sum(float(t[name]) for t in terms) / len(terms)
    for name, value in dict(stats or {}).items():
        line[str(name)] = _scalar(value)
    if schedule_line:
        line.update(schedule_line)
    return line


def _scalar(value: Any) -> Any:
    array = np.asarray(value)
    return array.item() if array.ndim == 0 else array


def training_programs(
    nitro: Nitro,
    state: TrainState,
    batch: dict[str, Any],
    values: dict[str, Any],
    hp: dict[str, Any],
    rng: Any,
) -> tuple[Any, Any]:
    """The training executables, from the handle or the cache.

    accum == 1: `(train_step, None)`, one fused program per step. accum > 1:
    `(gradient, optimizer)`, the gradient accumulated over micro-batches. Manual
    mode: `(manual_step, None)`, the experiment's own step (`manual.py`), run as
    the fused one is.
    """
    if nitro.prepared.manual:
        return manual_program(nitro, state, batch, values, hp, rng), None
    ctx = nitro.prepared.ctx
    accum = nitro.config.accum
    plan = nitro.prepared.plan
    assert plan is not None
    fields = nitro.prepared.routing.gradient_fields
    assert fields is not None  # routed at setup for a run with a train split
    traced = ("forward", "loss") + (
        ("train_metrics",) if fields.train_metrics is not None else ()
    )
    shapes = tuple((k, v.shape, str(v.dtype)) for k, v in batch.items())
    constants = {**plan.constants(), **plan.gradient_constants()}

    announce = nitro.executables.announcer()
    if accum == 1:
        args = (values, state.weights, state.model_state, batch, hp, rng)
        step = nitro.executables.get(
            "train_step",
            (shapes, fields, repr(constants)),
            lambda: ctx.compile(
                program_cache(),
                "train_step",
                train_step_fn(ctx, fields, plan),
                args,
                traced=traced,
                baked={"mode": "train", "fields": fields, **constants},
                donate=(1,),  # the Weights
                on_compile=announce,
            ),
        )
        return step, None

    grad_args = (
        values,
        state.params,
        state.model_state,
        state.accumulator,
        batch,
        hp["grad"],
        rng,
    )
    gradient = nitro.executables.get(
        "gradient",
        (shapes, accum, fields, repr(plan.gradient_constants())),
        lambda: ctx.compile(
            program_cache(),
            "gradient",
            gradient_fn(ctx, fields, accum, plan),
            grad_args,
            traced=traced,
            baked={
                "inv_accum": 1.0 / accum,
                "mode": "train",
                "fields": fields,
                **plan.gradient_constants(),
            },
            donate=(3,),  # the accumulator
            on_compile=announce,
        ),
    )
    opt_args = (values, state.weights, state.accumulator, hp)
    optimizer = nitro.executables.get(
        "optimizer",
        repr(plan.constants()),
        lambda: ctx.compile(
            program_cache(),
            "optimizer",
            optimizer_fn(ctx, plan),
            opt_args,
            traced=(),  # the rule's code is in its key: plan.constants()
            baked=plan.constants(),
            donate=(1, 2),  # the Weights and the accumulator
            on_compile=announce,
        ),
    )
    return gradient, optimizer


def _check_batch(
    host: dict[str, np.ndarray],
    names: tuple[str, ...],
    expected: int,
    index: int,
    epoch: int,
) -> None:
    """Refuse a train batch of another size (a partial batch met mid-epoch)."""
    for name in names:
        if host[name].shape[:1] != (expected,):
            size = batch_size(host, names)
            raise ConfigError(
                f"Train batch {index} of epoch {epoch} holds {size} samples, the "
                f"first held {expected}. The train split must drop its partial last "
                f"batch and keep one batch size (drop_remainder=True / "
                f"drop_last=True)."
            )


def _device_inputs(
    nitro: Nitro, device: dict[str, Any], current: dict[Target, float]
) -> dict[str, Any]:
    """The Device fields `device` with the scheduled ones overridden by NumPy values
    from `current`, the step's `schedule_values`."""
    scheduled = nitro.prepared.device_schedules
    if not scheduled:
        return device
    return {**device, **scheduled_devices(current, scheduled)}


def run_epoch(
    nitro: Nitro,
    epoch: int,
    *,
    skip: int = 0,
    carried: tuple[float, int] = (0.0, 0),
    events: StepEvents | None = None,
) -> EpochLog:
    """One epoch of micro-batches from the train split's feed; closed on every exit.

    It trains from `nitro.train_state` and commits the new state to the handle on
    every exit, a raising one included (the old one's buffers were donated).
    `skip`: batches a stopped run already trained this epoch; they are read (so the
    epoch's order and the source's state stay as they were) and passed over.
    `carried`: their running loss sum and count, which the epoch's mean continues.
    `events`: called after each optimizer step it places an event on (mid-epoch
    validation and checkpoints, max_steps); it may end the epoch there.
    """
    log = EpochLog(nitro, epoch, carried, skip)
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
    )
    log.feed = feed
    accum = nitro.config.accum
    try:
        delivered = _steps(nitro, epoch, feed, log, bar, skip, events)
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


EPOCH_ACCUM = (
    "The train split has {count} batches in epoch {epoch} (len() read after the "
    "epoch's plan was drawn), which does not divide by accum={accum} ({count} % "
    "{accum} = {rest}): every optimizer step takes {accum} micro-batches, and the "
    "last {rest} would carry their gradient into the next epoch. Keep each epoch's "
    "batch count a multiple of accum (have begin_epoch drop the extra batches), or "
    "change accum or the batch size so it divides."
)


def _check_epoch_count(source: Any, accum: int, epoch: int) -> None:
    """Refuse an epoch whose batch count does not divide by accum, before it trains.

    Called once the feed has delivered the epoch's first batch, so the plan that
    may change the count is drawn on every path (the fan-out's `begin_epoch`, the
    source's own `__iter__`)."""
    count = len(source)
    if count % accum:
        raise ConfigError(
            EPOCH_ACCUM.format(
                count=count, epoch=epoch, accum=accum, rest=count % accum
            )
        )


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
) -> int | None:
    """The hot loop. Every attribute it reads per step is bound to a local first;
    the per-step work is the dispatch plus one read-back. The training state lives
    in locals here (its parts are donated to each step) and is committed to the
    handle on every exit.

    At a step `events` places an event on (one integer compare per step finds it)
    the in-flight micro-batch is read back and the state committed first, so the
    events see the state after that step.

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
    settle = log.settle
    autolog = nitro.config.autolog_schedules and log.logging
    every = log.every
    gradient: Any = None
    optimizer: Any = None
    in_flight: _InFlight | None = None
    start = nitro.train_state
    weights, model_state = start.weights, start.model_state
    accumulator, step = start.accumulator, start.step
    step_values: dict[Target, float] = {}
    hp: dict[str, Any] = {}
    device: dict[str, Any] | None = None  # the Device fields `values` was merged from
    values: dict[str, Any] = {}
    signature: Signature = {}
    delivered: int | None = 0
    profiler = nitro.status.profiler  # None unless the run keyword profile= is set
    event = NEVER if events is None else events.next_after(step)
    try:
        for index, (full, routed) in enumerate(feed):
            _check_batch(routed, names, expected, index, epoch)
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
                hp = plan.step_inputs(step, step_values)
                device = None
                if profiler is not None:
                    profiler.at_step(step, weights)
            rng = step_rng_input(seed, step, index % accum)  # what step_rng() folds
            if nitro.device_values() is not device:  # set_device may replace it
                device = nitro.device_values()
                values = _device_inputs(nitro, device, step_values)
            if gradient is None:  # the epoch's first trained batch: its plan is drawn
                if accum > 1:
                    _check_epoch_count(nitro.data["train"], accum, epoch)
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
            current = _InFlight(
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
            if bar is not None:
                bar.step()
            # The step is dispatched: a staged device batch can go (the runtime frees
            # it when the step has run), which bounds device memory per batch.
            feed.release(routed)
            if in_flight is not None:
                settle(in_flight)
            in_flight = current
            delivered = index + 1
            if ends_step and step >= event:  # rare: only a step-based run's events
                assert events is not None
                settle(current)
                in_flight = None
                nitro.commit_state(
                    _current(start, weights, model_state, accumulator, step)
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
            if ends_step and nitro.status.stop_requested:
                delivered = None
                break
        if in_flight is not None:
            settle(in_flight)
    finally:
        nitro.commit_state(_current(start, weights, model_state, accumulator, step))
    return delivered


def _current(
    start: TrainState, weights: Any, model_state: Any, accumulator: Any, step: int
) -> TrainState:
    """The training state the hot loop holds in locals, as one value."""
    return start._replace(
        weights=weights, model_state=model_state, accumulator=accumulator, step=step
    )
