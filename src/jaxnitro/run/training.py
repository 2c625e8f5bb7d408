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
(`validations.StepEvents`, which the hot loop calls there); an epoch's last step
leaves both to the epoch end, so nothing runs twice. `max_steps` ends the epoch
after its step: that part-epoch is validated, gets its history row and is
checkpointed with its running loss, as a stop's is, so a longer run resumed from it
continues exactly.
Plateau and early stopping decide on each scheduled validation (a whole epoch's end,
or a multiple of val_every_n_steps); the extra validation a stop or max_steps adds
mid-epoch does not count, so a stopped and resumed run decides as a straight one.

A train() holds the lock of the directory its checkpointer writes
(`checkpoint/lock.py`) from its first step to its return, so a second process
writing that directory is refused before it writes anything.

It works on the handle's parts (`RunParts`): the state and Device values through
`RunValues`, the phase through `RunPhase`, the stop through `StopControl`; the handle
itself is what the `on_epoch_end` hooks receive and what the record's parameters and
the smoke report read.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

import jax

from ..compile.costs import step_flops
from ..devices.agreement import StopAgreement
from ..errors import ConfigError, NitroWarning
from ..logging import protocol as logproto
from ..logging.values import flatten
from ..loop.cadence import StepCadence
from ..loop.call_count import (
    auto_steps_per_call,
    ran_steps_per_call,
    remembered_steps_per_call,
    steps_per_call,
    train_family,
)
from ..loop.context import EpochContext
from ..loop.host_buffers import HostBuffers
from ..loop.read_ahead import ReadAhead
from ..loop.state import HeldStop
from ..loop.steps import EpochLog, run_epoch
from ..observe import phases
from ..observe.profiling import PROFILE_DIRNAME, StepProfiler
from ..observe.speed import device_peak, epoch_speed
from .costs import samples_per_step
from .records import write_checkpoint
from .restore import finish_restore_best, starting_state
from .smoke import print_smoke_report
from .validations import (
    StepEvents,
    Validation,
    held_stop,
    hold,
    log_validation,
    run_validation,
    show_monitored,
)

if TYPE_CHECKING:
    from .handle import Nitro
    from .parts import RunParts

NOTHING_TO_TRAIN = (
    "Nothing to train: the handle is at {what} {at} and {limit} is {value}. To train "
    "longer, continue the run with a new handle: "
    'Nitro(e, resume="auto", {limit}=N) ({limit} is fixed when a handle is built).'
)


def _epoch_steps(run: RunParts) -> int:
    """The optimizer steps of a whole epoch of the train split."""
    return run.config.accumulation.steps(len(run.data["train"]))


def epoch_context(
    run: RunParts,
    programs: dict[Hashable, Any] | None = None,
    read_ahead: ReadAhead | None = None,
    host_buffers: HostBuffers | None = None,
) -> EpochContext:
    """What the epoch about to run reads of the run (`loop/context.py`); its
    steps_per_call resolved now ("auto": 1 until the handle has chosen); of its
    `train()`: the train `programs` found so far (a new dict: none), where it reads
    ahead (`read_ahead`) and the `host_buffers` it stacks into (None: fresh)."""
    config, values = run.config, run.values
    chosen = run.status.auto_steps_per_call
    return EpochContext(
        accum=config.accum,
        seed=config.seed,
        steps_per_call=chosen or steps_per_call(config.steps_per_call, None),
        log_every_n_steps=config.log_every_n_steps,
        autolog_schedules=config.autolog_schedules,
        check_divergence=config.check_divergence,
        max_epochs=config.max_epochs,
        prepared=run.prepared,
        executables=run.executables,
        experiment=values.experiment,
        source=run.data["train"],
        logger=config.logger,
        bar=run.phase.progress(),
        stops=run.stops,
        profiler=run.status.profiler,
        device_values=lambda: values.device_values,
        current=lambda: values.state,
        commit=values.commit,
        programs={} if programs is None else programs,
        read_ahead=read_ahead,
        host_buffers=host_buffers,
    )


def _speed(
    log: EpochLog, step_seconds: float, *, samples: int, accum: int
) -> dict[str, float]:
    """The epoch's speed for its data line: steps and `samples` (per step) a
    second, and MFU where the train program's FLOPs and the device's peak are
    known."""
    return epoch_speed(
        step_seconds,
        samples,
        step_flops(log.program, accum),
        device_peak(jax.devices()[0]),
    )


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


def run_training(nitro: Nitro, run: RunParts) -> None:
    """Train from the current epoch to max_epochs (or the current step to
    max_steps, whichever comes first), or until a stop, holding the run
    directory's lock (taken here unless a resume took it at setup, and released
    when training returns or raises)."""
    run.lock.take(run.config.checkpointer, run.config.run_dir, purpose="train")
    try:
        if "train" not in run.data:
            raise ConfigError(
                f"train() needs a train split; the data holds: "
                f"{', '.join(run.data) or 'no splits'}."
            )
        training = _Training(nitro, run)
        if training.has_work():
            training.train()
    finally:
        run.lock.release()


class _Epoch:
    """What one epoch's stepping left for its end: its log and its timings."""

    def __init__(self, number: int, log: EpochLog, started: float) -> None:
        self.number = number
        self.log = log
        self.started = started
        self.speed: dict[str, float] = {}
        self.data_wait_frac = 0.0


class _Training:
    """One train(): its epochs, each stepped, validated, logged and checkpointed,
    then how it ends."""

    def __init__(self, nitro: Nitro, run: RunParts) -> None:
        self.nitro, self.run = nitro, run
        c = run.config
        # Fixed for the run (the global batch, accum, the processes): read once.
        self.samples_per_step = samples_per_step(run.prepared, c)
        self.cadence = StepCadence(
            c.max_steps, c.val_every_n_steps, c.checkpoint_every_n_steps
        )
        step = run.values.state.step
        # Across processes every rank reads one agreed stop (devices/agreement.py).
        self.agreement = StopAgreement(step) if jax.process_count() > 1 else None
        self.stops: Any = run.stops if self.agreement is None else self.agreement
        self.events = (
            None
            if self.cadence.is_empty
            else StepEvents(nitro, run, self.cadence, self.stops)
        )
        self.skip = 0
        # Whether an epoch of this train() ran at the count "auto" chose.
        self.ran_chosen = run.config.steps_per_call != "auto"
        self._family: Any = None  # the train program's family, once "auto" needs it
        # The train programs this train()'s epochs found (`EpochContext.programs`).
        self.programs: dict[Hashable, Any] = {}
        # An epoch's first block, staged while the epoch before ends, unless an
        # on_epoch_end hook could change the data in between (loop/read_ahead.py).
        self.ahead = None if run.epoch_end_hooks else ReadAhead()
        self.host_buffers = HostBuffers()  # reused once free: loop/host_buffers.py

    def family(self) -> Any:
        """The family of the run's train program, which "auto"'s count is
        remembered by in the process (`loop.call_count.train_family`): keyed once
        a train(), its parts fixed for the handle."""
        if self._family is None:
            run = self.run
            self._family = train_family(
                run.prepared, run.config.accum, _epoch_steps(run)
            )
        return self._family

    def _adopt_remembered_count(self) -> None:
        """With "auto" and no count chosen yet: the count this process chose for
        the run's train program family, if any, from this train()'s first epoch."""
        run = self.run
        status = run.status
        if (
            run.config.steps_per_call == "auto"
            and status.auto_steps_per_call is None
            and jax.process_count() == 1  # across processes "auto" is 1
        ):
            status.auto_steps_per_call = remembered_steps_per_call(self.family())

    def has_work(self) -> bool:
        """Whether the run is short of max_steps and max_epochs; else it warns."""
        c, state = self.run.config, self.run.values.state
        if self.cadence.ends_at(state.step):
            warnings.warn(
                NOTHING_TO_TRAIN.format(
                    what="step", at=state.step, limit="max_steps", value=c.max_steps
                ),
                NitroWarning,
                stacklevel=3,
            )
            return False
        self.skip = _trained_this_epoch(self.run)
        if state.epoch >= c.max_epochs and not self.skip:
            warnings.warn(
                NOTHING_TO_TRAIN.format(
                    what="epoch", at=state.epoch, limit="max_epochs", value=c.max_epochs
                ),
                NitroWarning,
                stacklevel=3,
            )
            return False
        return True

    def train(self) -> None:
        run = self.run
        run.stops.begin()  # a pending stop request is honoured, not reset
        self._adopt_remembered_count()
        # The optimizer state, the EMA and the accumulator, restored or allocated.
        values, prepared = run.values, run.prepared
        assert prepared.plan is not None
        values.commit(
            starting_state(
                values, prepared.plan, manual=prepared.manual, accum=run.config.accum
            )
        )
        _prepare_profile(run)
        reason = "error"
        try:
            reason = self._epochs()
        except BaseException as error:
            _fail(run, error, finalize=True)
            raise
        finally:
            if self.ahead is not None:  # a block no epoch took
                self.ahead.close()
            _stop_profile(run)
        self._finish(reason)

    def _epochs(self) -> str:
        """Run the epochs; how the run ended."""
        run, skip = self.run, self.skip
        current = run.values.state.epoch
        # A stop partway through an epoch left it unfinished: it continues first.
        first = current if skip else current + 1
        carried = _carried_loss(run, skip)
        reason = "error"
        for number in range(first, run.config.max_epochs + 1):
            epoch = self._step_epoch(
                number,
                skip=skip if number == first else 0,
                carried=carried if number == first else (0.0, 0),
            )
            reason, leave = self._end_epoch(epoch)
            if leave:
                break
        return reason

    def _step_epoch(
        self, number: int, *, skip: int, carried: tuple[float, int]
    ) -> _Epoch:
        """Train one epoch's steps; its train summary line goes out."""
        run, events = self.run, self.events
        values = run.values
        values.commit(values.state._replace(epoch=number))
        # Monitors see every epoch start, with `info.epoch_started`, even when the
        # run stays in TrainStepping between epochs (no validation).
        run.phase.enter(phases.TrainStepping(), epoch_started=number)
        started, steps_before = time.perf_counter(), values.state.step
        events_before = events.seconds if events is not None else 0.0
        # What the epoch reads of the run; it reads the next one's first block
        # ahead once its steps a call are known ("auto" measures the first epoch).
        known = run.config.steps_per_call != "auto" or (
            run.status.auto_steps_per_call is not None
        )
        ahead = self.ahead if known else None
        context = epoch_context(run, self.programs, ahead, self.host_buffers)
        log = run_epoch(
            context,
            number,
            skip=skip,
            carried=carried,
            events=events,
            agreement=self.agreement,
        )
        epoch = _Epoch(number, log, started)
        status = run.status
        chosen = status.auto_steps_per_call
        if not self.ran_chosen and context.steps_per_call == chosen:
            ran_steps_per_call(self.family(), chosen)  # its program compiled
            self.ran_chosen = True
        if (
            run.config.steps_per_call == "auto"
            and status.auto_steps_per_call is None
            and log.steady_step_seconds is not None
        ):  # chosen once, from steps that compiled nothing
            status.auto_steps_per_call = auto_steps_per_call(
                self.family(), log.steady_step_seconds, _epoch_steps(run)
            )
        stepped = values.state.step - steps_before
        if stepped:  # the loop read each step's loss back: the device is done
            seconds = time.perf_counter() - started
            if events is not None:  # mid-epoch validations are not stepping
                seconds -= events.seconds - events_before
            run.status.step_seconds = seconds / stepped
            epoch.speed = _speed(
                log,
                seconds / stepped,
                samples=self.samples_per_step,
                accum=run.config.accum,
            )
        waited = log.feed.wait_seconds if log.feed is not None else 0.0
        epoch.data_wait_frac = waited / max(time.perf_counter() - started, 1e-9)
        # The epoch's train summary line, whatever the train line's cadence; a
        # logger that holds lines writes it with the train lines it held and the
        # epoch's data and epoch lines (one write), or before a validation or an
        # on_epoch_end hook starts (`_log_data`, `run_validation`, `_end_epoch`).
        log.log_summary(values.state.step)
        values.sync_scheduled_devices()
        return epoch

    def _validate(self, epoch: _Epoch, partial: bool) -> tuple[Validation, bool]:
        """The epoch end's validation (the mid-epoch one at this step, if one ran)
        and whether it ran here."""
        run = self.run
        step = run.values.state.step
        midway = self.events.at(step) if self.events is not None else None
        if midway is not None:  # validated at this step already: not again
            return midway, False
        # An epoch a stop (or max_steps) cut short is validated and checkpointed,
        # but Plateau and early stopping decide on scheduled validations only: a
        # part-epoch counts when its step is a multiple of val_every_n_steps, else
        # once, when the continued epoch ends, as in a run never stopped.
        counted = not partial or self.cadence.validates_at(step)
        return run_validation(run, epoch.number, decides=counted), True

    def _end_epoch(self, epoch: _Epoch) -> tuple[str, bool]:
        """Validate, run the hooks, record, log and checkpoint the epoch; the run's
        reason so far and whether it ends here."""
        run, stops, log = self.run, self.stops, epoch.log
        requested = stops.stop_requested
        partial = 0 < log.trained < len(run.data["train"])
        validation, here = self._validate(epoch, partial)
        if run.epoch_end_hooks:  # user code, of any length: what is held goes first
            logproto.flush(run.config.logger)
        added = _epoch_end_hooks(
            self.nitro, run, epoch.number, log.mean_loss(), validation.flat
        )
        flat = {**validation.flat, **added}
        step = run.values.state.step
        if self.agreement is not None:  # every rank is at this epoch's end: it votes
            self.agreement.vote(step, run.stops.stop_requested, run.stops.preempted)
        # A stop asked for during validation ends the run after this epoch too.
        requested = requested or stops.stop_requested
        hold(run.values, held_stop(run.values.state, log) if partial else None)
        reached = self.cadence.ends_at(step)
        self._record(epoch, flat)
        if (validation.metrics or added) and here:
            log_validation(
                run.config.logger, step, epoch.number, flat, validation.scales
            )
        elif added:  # the mid-epoch line at this step lacks what the hooks added
            log_validation(run.config.logger, step, epoch.number, added, {})
        self._log_data(epoch)
        reason = "error"
        if requested:
            reason = "preempted" if stops.preempted else "requested"
        elif validation.early:
            reason = "early_stop"
        elif epoch.number == run.config.max_epochs or reached:
            reason = "completed"
        final = reason if reason != "error" else None
        write_checkpoint(self.nitro, run, epoch.number, flat, final)
        return reason, requested or validation.early or reached

    def _record(self, epoch: _Epoch, flat: dict[str, Any]) -> None:
        """The epoch's history row (replacing the row of its part before a stop),
        shown on the progress line."""
        run = self.run
        history = run.status.history
        if history and history[-1]["epoch"] == epoch.number:
            history.pop()  # the row of this epoch's part before a stop
        row = _history_row(
            epoch.number,
            run.values.state.step,
            epoch.log.mean_loss(),
            flat,
            time.perf_counter() - epoch.started,
        )
        history.append(row)
        progress = run.phase.progress()
        if progress is not None:
            show_monitored(progress, run.prepared.monitor, flat)
            progress.epoch_summary(row, run.config.max_epochs)

    def _log_data(self, epoch: _Epoch) -> None:
        """The epoch's data line (data wait, speed) and its history row; the
        logger flushed (the epoch's one flush: a JSONLogger wrote its held lines
        with the epoch line)."""
        run = self.run
        logger = run.config.logger
        logproto.log_metrics(
            logger,
            {"data_wait_frac": epoch.data_wait_frac, **epoch.speed},
            step=run.values.state.step,
            epoch=epoch.number,
            context="data",
        )
        logproto.log_epoch(logger, run.status.history[-1])
        logproto.flush(logger)

    def _finish(self, reason: str) -> None:
        """End a train() whose epochs ended for `reason`: the last record marked,
        restore_best, the logger finished, the Done phase, a smoke run's report."""
        run = self.run
        run.stops.end(reason)
        try:
            _finalize_checkpoints(run, reason)
            finish_restore_best(self.nitro, run.values)
        except BaseException as error:
            # The epochs are done and their records hold how training ended, but
            # this train() raises: the logger still finishes and the handle ends
            # Failed.
            _fail(run, error, finalize=False)
            raise
        try:
            _finish_logger(run, reason)
        except BaseException as error:
            # Its finish ran and raised: the run ends Failed without a second call.
            _fail(run, error, finalize=False, finish_logger=False)
            raise
        run.phase.set_phase(phases.Done())
        uncut = run.prepared.uncut_sizes
        if uncut is not None:
            print_smoke_report(self.nitro, uncut)


def _epoch_end_hooks(
    nitro: Nitro, run: RunParts, epoch: int, train_loss: float, flat: dict[str, Any]
) -> dict[str, Any]:
    """Run the `on_epoch_end` hooks in order; the metrics they added, flattened."""
    added: dict[str, Any] = {}
    for hook in run.epoch_end_hooks:
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


def _prepare_profile(run: RunParts) -> None:
    """Make the `profile=` keyword's profiler, once per handle."""
    profile = run.config.profile
    if profile is not None and run.status.profiler is None:
        directory = os.path.join(run.config.run_dir, PROFILE_DIRNAME)
        run.status.profiler = StepProfiler(*profile, directory)


def _stop_profile(run: RunParts) -> None:
    """End a trace the run's end cut short; on an error path, quietly."""
    profiler = run.status.profiler
    if profiler is not None:
        with contextlib.suppress(Exception):  # never mask how the run ended
            profiler.stop(run.values.state.weights)


def _trained_this_epoch(run: RunParts) -> int:
    """How many batches of the current epoch a stop left trained (0 when it ended).

    The stop recorded it (`HeldStop.batches`, in the train state and in the record
    written at the stop); without that record, as of a record written before it was
    kept, it follows from the step count, the batch count and accum, which holds
    while neither changes."""
    state = run.values.state
    if state.epoch < 1 or "train" not in run.data:
        return 0
    accumulation = run.config.accumulation
    held = _held_stop(run)
    if held is not None and held.batches is not None:
        accumulation.refuse_stopped(held.batches, state.epoch)
        return held.batches
    per_epoch = _epoch_steps(run)
    done = state.step - (state.epoch - 1) * per_epoch
    return accumulation.batches(done) if 0 < done < per_epoch else 0


def _held_stop(run: RunParts) -> HeldStop | None:
    """What the stop that cut the current epoch recorded (`validations.held_stop`),
    held by the train state (set at the stop, or read from the resumed record);
    None when no stop left the run here."""
    state = run.values.state
    held = state.held
    return held if held is not None and held.is_at(state.epoch, state.step) else None


def _carried_loss(run: RunParts, skip: int) -> tuple[float, int]:
    """The running loss sum and count of the `skip` batches a stop left trained
    this epoch; (0.0, 0) when none matches (a record written before it was kept:
    the row then covers the rest only)."""
    held = _held_stop(run)
    if skip and held is not None and held.loss_count == skip:
        return held.loss_sum, skip
    return 0.0, 0


def _fail(
    run: RunParts, error: BaseException, *, finalize: bool, finish_logger: bool = True
) -> None:
    """End a train() that raises `error`: stop reason "error", the logger finished
    (unless `finish_logger` is False: its finish raised `error`) and, when
    `finalize`, the last record marked, then the Failed phase (which releases the
    sources)."""
    run.stops.end("error")
    finishers = [("logger's finish", _finish_logger)] if finish_logger else []
    if finalize:
        finishers.insert(0, ("checkpointer's finalize", _finalize_checkpoints))
    for what, finish in finishers:
        try:
            finish(run, "error")
        except Exception as failure:  # never mask the error that ended the run
            error.add_note(f"The {what}('error') also failed: {failure}")
    run.phase.set_phase(phases.Failed())


def _finalize_checkpoints(run: RunParts, reason: str) -> None:
    """Write how the run ended into its last kept record, if a selector kept it."""
    if run.config.checkpointer is not None:
        run.config.checkpointer.finalize(reason)


def _finish_logger(run: RunParts, reason: str) -> None:
    logproto.finish(run.config.logger, reason)
