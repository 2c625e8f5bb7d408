"""The automatic training loop: epochs, validation, stopping rules, checkpoints, logs.

Each epoch runs the micro-batches (`steps.run_epoch`) and writes its train summary
line (`EpochLog.log_summary`, whatever log_every_n_steps), then validates, updates
every Plateau and the early-stopping policy from the validation metrics, runs the
`Nitro.on_epoch_end` hooks (whose metrics join the validation's), appends one
history row, writes the validate line, and checkpoints. The run ends at max_epochs
or max_steps ("completed"), at an early stop ("early_stop"), at a requested stop
("requested"), at a stop a SIGTERM requested ("preempted"), or by raising ("error").

Step-based runs (`cadence.StepCadence`): `val_every_n_steps` also validates, and
`checkpoint_every_n_steps` also checkpoints, after each multiple of it, mid-epoch
(`_StepEvents`, which the hot loop calls there); an epoch's last step leaves both to
the epoch end, so nothing runs twice. `max_steps` ends the epoch after its step:
that part-epoch is validated, gets its history row and is checkpointed with its
running loss, as a stop's is, so a longer run resumed from it continues exactly.
Plateau and early stopping decide on each scheduled validation (a whole epoch's end,
or a multiple of val_every_n_steps); the extra validation a stop or max_steps adds
mid-epoch does not count, so a stopped and resumed run decides as a straight one.

A train() holds the lock of the directory its checkpointer writes
(`checkpoint/lock.py`) from its first step to its return, so a second process
writing that directory is refused before it writes anything.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp

from ..checkpoint.lock import lock_checkpoint_dir
from ..compile.boundary import owned_copy
from ..compile.costs import step_flops
from ..devices.agreement import StopAgreement
from ..errors import ConfigError, NitroWarning
from ..logging import protocol as logproto
from ..logging.values import flatten
from ..loop.cadence import StepCadence
from ..loop.calls import steps_per_call
from ..loop.context import EpochContext
from ..loop.evaluate import evaluate_split
from ..loop.steps import EpochLog, run_epoch
from ..observe import phases
from ..observe.profiling import PROFILE_DIRNAME, StepProfiler
from ..observe.speed import device_peak, epoch_speed
from ..optim.schedules import check_plateau_metrics
from ..watch import did_you_mean
from .costs import samples_per_step
from .records import write_checkpoint
from .restore import finish_restore_best, optimizer_state
from .smoke import print_smoke_report
from .status import HeldStop

if TYPE_CHECKING:
    from .handle import Nitro


def epoch_context(nitro: Nitro) -> EpochContext:
    """What the epoch about to run reads of the handle (`context.py`); its
    steps_per_call resolved now ("auto" follows the last epoch's step time)."""
    config, status = nitro.config, nitro.status
    return EpochContext(
        accum=config.accum,
        seed=config.seed,
        steps_per_call=steps_per_call(config.steps_per_call, status.step_seconds),
        log_every_n_steps=config.log_every_n_steps,
        autolog_schedules=config.autolog_schedules,
        check_divergence=config.check_divergence,
        max_epochs=config.max_epochs,
        prepared=nitro.prepared,
        executables=nitro.executables,
        experiment=nitro.experiment,
        source=nitro.data["train"],
        logger=nitro.logger,
        bar=nitro.progress(),
        stops=status,
        profiler=status.profiler,
        device_values=nitro.device_values,
        current=lambda: nitro.train_state,
        commit=nitro.commit_state,
    )


def _speed(nitro: Nitro, log: EpochLog, step_seconds: float) -> dict[str, float]:
    """The epoch's speed for its data line: steps and samples a second, and MFU
    where the train program's FLOPs and the device's peak are known."""
    return epoch_speed(
        step_seconds,
        samples_per_step(nitro),
        step_flops(log.program, nitro.config.accum),
        device_peak(jax.devices()[0]),
    )


def _ensure_optimizer_state(nitro: Nitro) -> None:
    """Allocate (or restore) the optimizer state, the EMA and the accumulator."""
    plan = nitro.prepared.plan
    assert plan is not None
    state = nitro.train_state
    params = state.params
    if nitro.prepared.manual and nitro.status.pending_record is not None:
        # Manual mode: setup_optimizers built the states at construction; a resume
        # restores the record's arrays into that structure (rules kept).
        pending = nitro.status.pending_record
        state = state.with_weights(
            opt_state=optimizer_state(pending, plan, state.opt_state)
        )
        nitro.status.pending_record = None
    elif state.opt_state is None:
        record = nitro.status.pending_record
        opt_state = optimizer_state(record, plan, plan.init_state(params))
        state = state.with_weights(opt_state=opt_state)
        # The record's arrays are no longer needed: everything is placed.
        nitro.status.pending_record = None
    if plan.ema is not None and state.ema is None:
        state = state.with_weights(ema=owned_copy(params))  # the weights
    if nitro.config.accum > 1 and state.accumulator is None:
        state = state._replace(accumulator=jax.tree.map(jnp.zeros_like, params))
    nitro.commit_state(state)


_ROW_AXES = ("epoch", "step", "train_loss", "seconds")


def _history_row(
    epoch: int, step: int, train_loss: float, metrics: dict[str, Any], seconds: float
) -> dict[str, Any]:
    clash = [name for name in _ROW_AXES if name in metrics]
    if clash:
        raise ConfigError(
            f"Validation returned a metric named `{clash[0]}`, which is a column the "
            f"history keeps for itself ({', '.join(_ROW_AXES)}). Rename the metric."
        )
    return {
        "epoch": epoch,
        "step": step,
        "train_loss": train_loss,
        **metrics,
        "seconds": seconds,
    }


def _after_validation(
    nitro: Nitro, epoch: int, metrics: dict[str, Any]
) -> tuple[bool, dict[str, float]]:
    """Update every Plateau and the stopping policy; (stop?, plateau scales)."""
    plan = nitro.prepared.plan
    assert plan is not None
    scales = (
        check_plateau_metrics(list(plan.schedules), metrics, epoch=epoch)
        if metrics
        else {}
    )
    stop = False
    if nitro.prepared.stopper is not None:
        stop = bool(nitro.prepared.stopper.should_stop(epoch, metrics))
    return stop, scales


def _show_epoch(nitro: Nitro, flat: dict[str, Any]) -> None:
    """The progress line shows the monitored validation metric from now on, and
    the epoch's summary line goes out (written on stderr when no one watches)."""
    progress = nitro.progress()
    if progress is None:
        return
    monitor = nitro.prepared.monitor
    if monitor is not None and monitor[0] in flat:
        progress.show({f"val {monitor[0]}": float(flat[monitor[0]])})
    progress.epoch_summary(nitro.status.history[-1], nitro.config.max_epochs)


def _check_monitor(nitro: Nitro, flat: dict[str, Any]) -> None:
    """Refuse a monitor that names no metric validation returned, whether or not
    anything follows it: with custom metrics a misspelled monitor cannot be caught
    before validation runs (the spec)."""
    monitor = nitro.prepared.monitor
    if flat and monitor is not None and monitor[0] not in flat:
        raise ConfigError(
            f"monitor() names `{monitor[0]}` ({monitor[1]}), but validation returned "
            f"{', '.join(flat)}.{did_you_mean(monitor[0], flat)} Return that key from "
            f"metrics or finalize_metrics, or fix monitor()."
        )


@dataclass(frozen=True)
class _Validation:
    """A validation run at an optimizer step, and what the policies decided."""

    step: int
    metrics: dict[str, Any]
    flat: dict[str, Any]
    scales: dict[str, float]
    early: bool


def _validate_midway(nitro: Nitro, epoch: int) -> _Validation:
    """Validate at the current step inside `epoch`; Plateau and early stopping
    decide on it; the validate line goes out."""
    nitro.sync_scheduled_devices()
    metrics = evaluate_split(nitro, "val", stoppable=False)
    flat = flatten(metrics)
    _check_monitor(nitro, flat)
    early, scales = _after_validation(nitro, epoch, metrics)
    progress = nitro.progress()
    monitor = nitro.prepared.monitor
    if progress is not None and monitor is not None and monitor[0] in flat:
        progress.show({f"val {monitor[0]}": float(flat[monitor[0]])})
    if metrics:
        _log_validation(nitro, epoch, flat, scales)
    return _Validation(nitro.current_step, metrics, flat, scales, early)


def _log_validation(
    nitro: Nitro, epoch: int, flat: dict[str, Any], scales: dict[str, float]
) -> None:
    """The validate line: the flattened metrics and the Plateau scales."""
    logproto.log_metrics(
        nitro.logger,
        {**flat, **scales},
        step=nitro.current_step,
        epoch=epoch,
        context="validate",
    )


class _StepEvents:
    """The mid-epoch events of one train() (`steps.StepEvents`): validation and
    checkpoints every N steps, and max_steps."""

    def __init__(self, nitro: Nitro, cadence: StepCadence, stops: Any) -> None:
        self.nitro = nitro
        self.cadence = cadence
        self.stops = stops
        """Where the stop flag is read: the handle's status, or across processes
        the agreed stop (`StopAgreement`), the same on every rank."""
        self.validated: _Validation | None = None
        """The last mid-epoch validation, which the epoch end reuses at its step."""
        self.seconds = 0.0
        """Wall time spent in the events, which the step time leaves out."""

    def next_after(self, step: int) -> int:
        return self.cadence.next_after(step)

    def fire(self, step: int, log: EpochLog) -> bool:
        started = time.perf_counter()
        try:
            return self._fire(step, log)
        finally:
            self.seconds += time.perf_counter() - started

    def _fire(self, step: int, log: EpochLog) -> bool:
        nitro, cadence = self.nitro, self.cadence
        source = nitro.data["train"]
        if log.trained >= len(source):
            return False  # the epoch's last step: the epoch end runs what is due
        if cadence.ends_at(step) or self.stops.stop_requested:
            return True  # the epoch end validates and checkpoints, once
        flat: dict[str, Any] = {}
        leave = False
        if cadence.validates_at(step):
            self.validated = _validate_midway(nitro, log.epoch)
            flat, leave = self.validated.flat, self.validated.early
            bar = nitro.progress()
            if bar is not None:  # the train stretch again, where it stood
                bar.begin(
                    "train",
                    len(source),
                    epoch=log.epoch,
                    max_epochs=nitro.config.max_epochs,
                )
                for _ in range(log.trained):
                    bar.step()
        leave = leave or self.stops.stop_requested
        if cadence.checkpoints_at(step) and not leave:
            # Where the epoch stands: a resume from this record continues it.
            write_checkpoint(nitro, log.epoch, flat, None, _loss_so_far(nitro, log))
        return leave

    def at(self, step: int) -> _Validation | None:
        """The mid-epoch validation run at `step`, if one was."""
        validated = self.validated
        return validated if validated is not None and validated.step == step else None


def run_training(nitro: Nitro) -> None:
    """Train `nitro` from its current epoch to max_epochs (or its current step to
    max_steps, whichever comes first), or until a stop, holding
    the run directory's lock (taken here unless a resume took it at setup, and
    released when training returns or raises)."""
    if nitro.status.run_lock is None:
        nitro.status.run_lock = lock_checkpoint_dir(
            nitro.checkpointer, nitro.config.run_dir, purpose="train"
        )
    try:
        _train(nitro)
    finally:
        nitro.status.release_run_lock()


def _train(nitro: Nitro) -> None:
    if "train" not in nitro.data:
        raise ConfigError(
            f"train() needs a train split; the data holds: "
            f"{', '.join(nitro.data) or 'no splits'}."
        )
    max_epochs = nitro.config.max_epochs
    c = nitro.config
    cadence = StepCadence(c.max_steps, c.val_every_n_steps, c.checkpoint_every_n_steps)
    if cadence.ends_at(nitro.current_step):
        warnings.warn(
            f"Nothing to train: the handle is at step {nitro.current_step} and "
            f"max_steps is {c.max_steps}. To train longer, continue the run with a "
            f'new handle: Nitro(e, resume="auto", max_steps=N) (max_steps is fixed '
            f"when a handle is built).",
            NitroWarning,
            stacklevel=3,
        )
        return
    # Across processes every rank reads one agreed stop (devices/agreement.py).
    agreement = StopAgreement(nitro.current_step) if jax.process_count() > 1 else None
    stops: Any = nitro.status if agreement is None else agreement
    events = None if cadence.is_empty else _StepEvents(nitro, cadence, stops)
    skip = _trained_this_epoch(nitro)
    if nitro.current_epoch >= max_epochs and not skip:
        warnings.warn(
            f"Nothing to train: the handle is at epoch {nitro.current_epoch} and "
            f"max_epochs is {max_epochs}. To train longer, continue the run with a new "
            f'handle: Nitro(e, resume="auto", max_epochs=N) (max_epochs is fixed '
            f"when a handle is built).",
            NitroWarning,
            stacklevel=3,
        )
        return
    nitro.status.stop_reason = None  # a pending stop request is honoured, not reset
    _ensure_optimizer_state(nitro)
    _prepare_profile(nitro)
    reason = "error"
    try:
        # A stop partway through an epoch left it unfinished: it continues first.
        first = nitro.current_epoch if skip else nitro.current_epoch + 1
        carried = _carried_loss(nitro, skip)
        for epoch in range(first, max_epochs + 1):
            nitro.commit_state(nitro.train_state._replace(epoch=epoch))
            # Monitors see every epoch start, with `info.epoch_started`, even when
            # the run stays in TrainStepping between epochs (no validation).
            nitro.phase_recorder.enter(phases.TrainStepping(), epoch_started=epoch)
            started, steps_before = time.perf_counter(), nitro.current_step
            events_before = events.seconds if events is not None else 0.0
            log = run_epoch(
                epoch_context(nitro),
                epoch,
                skip=skip if epoch == first else 0,
                carried=carried if epoch == first else (0.0, 0),
                events=events,
                agreement=agreement,
            )
            stepped = nitro.current_step - steps_before
            speed: dict[str, float] = {}
            if stepped:  # the loop read each step's loss back: the device is done
                seconds = time.perf_counter() - started
                if events is not None:  # mid-epoch validations are not stepping
                    seconds -= events.seconds - events_before
                nitro.status.step_seconds = seconds / stepped
                speed = _speed(nitro, log, seconds / stepped)
            waited = log.feed.wait_seconds if log.feed is not None else 0.0
            data_wait_frac = waited / max(time.perf_counter() - started, 1e-9)
            # The epoch's train summary line, whatever the train line's cadence.
            log.log_summary(nitro.current_step)
            nitro.sync_scheduled_devices()
            requested = stops.stop_requested
            partial = 0 < log.trained < len(nitro.data["train"])
            midway = events.at(nitro.current_step) if events is not None else None
            if midway is not None:  # validated at this step already: not again
                metrics, flat = midway.metrics, midway.flat
                early, scales = midway.early, midway.scales
            else:
                metrics = (
                    evaluate_split(nitro, "val", stoppable=False)
                    if "val" in nitro.data
                    else {}
                )
                flat = flatten(metrics)
                _check_monitor(nitro, flat)
                # An epoch a stop (or max_steps) cut short is validated and
                # checkpointed, but Plateau and early stopping decide on scheduled
                # validations only: a part-epoch counts when its step is a multiple
                # of val_every_n_steps, else once, when the continued epoch ends,
                # as in a run never stopped.
                counted = not partial or cadence.validates_at(nitro.current_step)
                early, scales = (
                    _after_validation(nitro, epoch, metrics) if counted else (False, {})
                )
            added = _epoch_end_hooks(nitro, epoch, log.mean_loss(), flat)
            flat = {**flat, **added}
            if agreement is not None:  # every rank is at this epoch's end: it votes
                status = nitro.status
                agreement.vote(
                    nitro.current_step, status.stop_requested, status.preempted
                )
            # A stop asked for during validation ends the run after this epoch too.
            requested = requested or stops.stop_requested
            nitro.status.held_stop = _loss_so_far(nitro, log) if partial else None
            reached = cadence.ends_at(nitro.current_step)
            if nitro.status.history and nitro.status.history[-1]["epoch"] == epoch:
                nitro.status.history.pop()  # the row of this epoch's part before a stop
            row = _history_row(
                epoch,
                nitro.current_step,
                log.mean_loss(),
                flat,
                time.perf_counter() - started,
            )
            nitro.status.history.append(row)
            _show_epoch(nitro, flat)
            if (metrics or added) and midway is None:
                _log_validation(nitro, epoch, flat, scales)
            elif added:  # the mid-epoch line at this step lacks what the hooks added
                _log_validation(nitro, epoch, added, {})
            logproto.log_metrics(
                nitro.logger,
                {"data_wait_frac": data_wait_frac, **speed},
                step=nitro.current_step,
                epoch=epoch,
                context="data",
            )
            logproto.log_epoch(nitro.logger, row)  # the history row, read back whole
            if requested:
                reason = "preempted" if stops.preempted else "requested"
            elif early:
                reason = "early_stop"
            elif epoch == max_epochs or reached:
                reason = "completed"
            write_checkpoint(
                nitro,
                epoch,
                flat,
                reason if reason != "error" else None,
                nitro.status.held_stop,
            )
            if requested or early or reached:
                break
    except BaseException as error:
        _fail(nitro, error, finalize=True)
        raise
    finally:
        _stop_profile(nitro)
    nitro.status.stop_reason = reason
    try:
        _finalize_checkpoints(nitro, reason)
        finish_restore_best(nitro)
    except BaseException as error:
        # The epochs are done and their records hold how training ended, but this
        # train() raises: the logger still finishes and the handle ends Failed.
        _fail(nitro, error, finalize=False)
        raise
    try:
        _finish_logger(nitro, reason)
    except BaseException as error:
        # Its finish ran and raised: the run ends Failed without a second call.
        _fail(nitro, error, finalize=False, finish_logger=False)
        raise
    nitro.set_phase(phases.Done())
    uncut = nitro.prepared.uncut_sizes
    if uncut is not None:
        print_smoke_report(nitro, uncut)


def _epoch_end_hooks(
    nitro: Nitro, epoch: int, train_loss: float, flat: dict[str, Any]
) -> dict[str, Any]:
    """Run the `on_epoch_end` hooks in order; the metrics they added, flattened."""
    added: dict[str, Any] = {}
    for hook in nitro.status.epoch_end_hooks:
        observations = {"train_loss": train_loss, **flat, **added}
        returned = hook(nitro, epoch, observations)
        if returned is None:
            continue
        if not isinstance(returned, dict):
            raise ConfigError(
                f"The on_epoch_end hook {getattr(hook, '__name__', hook)!r} returned "
                f"{type(returned).__name__}; it returns a dict of metrics or None."
            )
        added.update(flatten(returned))
    return added


def _prepare_profile(nitro: Nitro) -> None:
    """Make the `profile=` keyword's profiler, once per handle."""
    profile = nitro.config.profile
    if profile is not None and nitro.status.profiler is None:
        directory = os.path.join(nitro.run_dir, PROFILE_DIRNAME)
        nitro.status.profiler = StepProfiler(*profile, directory)


def _stop_profile(nitro: Nitro) -> None:
    """End a trace the run's end cut short; on an error path, quietly."""
    profiler = nitro.status.profiler
    if profiler is not None:
        with contextlib.suppress(Exception):  # never mask how the run ended
            profiler.stop(nitro.train_state.weights)


def _trained_this_epoch(nitro: Nitro) -> int:
    """How many batches of the current epoch a stop left trained (0 when it ended).

    The stop recorded it (`HeldStop.batches`, on the handle and in the record
    written at the stop); without that record, as of a record written before it was
    kept, it follows from the step count, the batch count and accum, which holds
    while neither changes."""
    if nitro.current_epoch < 1 or "train" not in nitro.data:
        return 0
    accumulation = nitro.config.accumulation
    held = _held_stop(nitro)
    if held is not None and held.batches is not None:
        accumulation.refuse_stopped(held.batches, nitro.current_epoch)
        return held.batches
    per_epoch = accumulation.steps(len(nitro.data["train"]))
    done = nitro.current_step - (nitro.current_epoch - 1) * per_epoch
    return accumulation.batches(done) if 0 < done < per_epoch else 0


def _loss_so_far(nitro: Nitro, log: EpochLog) -> HeldStop:
    """Where a stop cut an epoch, for the rest of it (kept on the handle and in the
    record written at the stop): the batches trained and the running train loss."""
    total, count = log.carried()
    return HeldStop(nitro.current_epoch, nitro.current_step, log.trained, total, count)


def _held_stop(nitro: Nitro) -> HeldStop | None:
    """What the stop that cut the current epoch recorded (`_loss_so_far`), on the
    handle or read from the resumed record; None when no stop left the handle here."""
    held = nitro.status.held_stop
    if (
        held is not None
        and held.epoch == nitro.current_epoch
        and held.step == nitro.current_step
    ):
        return held
    return None


def _carried_loss(nitro: Nitro, skip: int) -> tuple[float, int]:
    """The running loss sum and count of the `skip` batches a stop left trained
    this epoch; (0.0, 0) when none matches (a record written before it was kept:
    the row then covers the rest only)."""
    held = _held_stop(nitro)
    if skip and held is not None and held.loss_count == skip:
        return held.loss_sum, skip
    return 0.0, 0


def _fail(
    nitro: Nitro, error: BaseException, *, finalize: bool, finish_logger: bool = True
) -> None:
    """End a train() that raises `error`: stop reason "error", the logger finished
    (unless `finish_logger` is False: its finish raised `error`) and, when
    `finalize`, the last record marked, then the Failed phase (which releases the
    sources)."""
    nitro.status.stop_reason = "error"
    finishers = [("logger's finish", _finish_logger)] if finish_logger else []
    if finalize:
        finishers.insert(0, ("checkpointer's finalize", _finalize_checkpoints))
    for what, finish in finishers:
        try:
            finish(nitro, "error")
        except Exception as failure:  # never mask the error that ended the run
            error.add_note(f"The {what}('error') also failed: {failure}")
    nitro.set_phase(phases.Failed())


def _finalize_checkpoints(nitro: Nitro, reason: str) -> None:
    """Write how the run ended into its last kept record, if a selector kept it."""
    if nitro.checkpointer is not None:
        nitro.checkpointer.finalize(reason)


def _finish_logger(nitro: Nitro, reason: str) -> None:
    logproto.finish(nitro.logger, reason)
