"""Validation inside `train()`: at an epoch's end and every N steps, and what the
policies decide on it.

Each validation (`run_validation`, at an epoch's end and mid-epoch alike) runs the val
split (`loop/evaluate.py`) on the run's `RunEvaluation`, refuses a monitor naming no
metric it returned, and updates every Plateau and the early-stopping policy
(`after_validation`); the validate line follows. The helpers take the field they
read (the monitor, the progress line, the logger), not the run. `StepEvents` is
what the hot loop calls mid-epoch (`steps.StepEvents`): a validation and a
checkpoint every N steps, and max_steps; an epoch's last step leaves both to the
epoch end, so nothing runs twice.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..logging import protocol as logproto
from ..logging.values import flatten
from ..loop.cadence import StepCadence
from ..loop.evaluate import evaluate_split
from ..loop.state import HeldStop, TrainState
from ..loop.steps import EpochLog
from ..optim.schedules import check_plateau_metrics
from ..watch import did_you_mean
from .records import write_checkpoint

if TYPE_CHECKING:
    from ..loop.prepared import Prepared
    from ..observe.progress import Progress
    from .handle import Nitro
    from .parts import RunParts
    from .values import RunValues


@dataclass(frozen=True)
class Validation:
    """A validation run at an optimizer step, and what the policies decided.

    Attributes:
        step: the optimizer step it ran at.
        metrics: the metrics validation returned.
        flat: those metrics, flattened.
        scales: each Plateau's scale after it (for the validate line).
        early: the early-stopping policy asked to stop.
    """

    step: int
    metrics: dict[str, Any]
    flat: dict[str, Any]
    scales: dict[str, float]
    early: bool


def run_validation(run: RunParts, epoch: int, *, decides: bool = True) -> Validation:
    """Validate at the current step of `epoch`: the val split's metrics (none
    without a val split), a monitor naming no metric refused; when `decides`,
    every Plateau and the early-stopping policy decide on it.

    The one place a validation inside train() is taken, at an epoch's end and
    mid-epoch alike. A logger holding lines writes them first: an evaluation may
    run for minutes."""
    metrics: dict[str, Any] = {}
    if "val" in run.data:
        logproto.flush(run.config.logger)
        metrics = evaluate_split(run.evaluation, "val", stoppable=False)
    flat = flatten(metrics)
    check_monitor(run.prepared.monitor, flat)
    early, scales = (
        after_validation(run.prepared, epoch, metrics) if decides else (False, {})
    )
    return Validation(run.values.state.step, metrics, flat, scales, early)


def after_validation(
    prepared: Prepared, epoch: int, metrics: dict[str, Any]
) -> tuple[bool, dict[str, float]]:
    """Update every Plateau and the stopping policy; (stop?, plateau scales)."""
    plan = prepared.plan
    assert plan is not None
    scales = (
        check_plateau_metrics(list(plan.schedules), metrics, epoch=epoch)
        if metrics
        else {}
    )
    stop = False
    if prepared.stopper is not None:
        stop = bool(prepared.stopper.should_stop(epoch, metrics))
    return stop, scales


def check_monitor(monitor: tuple[str, str] | None, flat: dict[str, Any]) -> None:
    """Refuse a monitor that names no metric validation returned, whether or not
    anything follows it: with custom metrics a misspelled monitor cannot be caught
    before validation runs (the spec)."""
    if flat and monitor is not None and monitor[0] not in flat:
        raise ConfigError(
            f"monitor() names `{monitor[0]}` ({monitor[1]}), but validation returned "
            f"{', '.join(flat)}.{did_you_mean(monitor[0], flat)} Return that key from "
            f"metrics or finalize_metrics, or fix monitor()."
        )


def show_monitored(
    progress: Progress | None, monitor: tuple[str, str] | None, flat: dict[str, Any]
) -> None:
    """The progress line shows the monitored validation metric from now on."""
    if progress is not None and monitor is not None and monitor[0] in flat:
        progress.show({f"val {monitor[0]}": float(flat[monitor[0]])})


def log_validation(
    logger: Any,
    step: int,
    epoch: int,
    flat: dict[str, Any],
    scales: dict[str, float],
) -> None:
    """The validate line: the flattened metrics and the Plateau scales."""
    logproto.log_metrics(
        logger, {**flat, **scales}, step=step, epoch=epoch, context="validate"
    )


def validate_midway(run: RunParts, epoch: int) -> Validation:
    """Validate at the current step inside `epoch`; Plateau and early stopping
    decide on it; the validate line goes out."""
    run.values.sync_scheduled_devices()
    validation = run_validation(run, epoch)
    show_monitored(run.phase.progress(), run.prepared.monitor, validation.flat)
    if validation.metrics:
        log_validation(
            run.config.logger,
            validation.step,
            epoch,
            validation.flat,
            validation.scales,
        )
    return validation


def held_stop(state: TrainState, log: EpochLog) -> HeldStop:
    """Where `state` stands in the epoch `log` is stepping, for the rest of it:
    the batches trained and the running train loss."""
    total, count = log.carried()
    return HeldStop(state.epoch, state.step, log.trained, total, count)


def hold(values: RunValues, held: HeldStop | None) -> None:
    """Commit the run's state with `held`: where a stop (or max_steps, or a
    checkpoint) left its epoch unfinished, or None when the epoch ended whole. The
    record written next keeps it (`records.write_checkpoint`)."""
    values.commit(values.state._replace(held=held))


class StepEvents:
    """The mid-epoch events of one train() (`steps.StepEvents`): validation and
    checkpoints every N steps, and max_steps.

    Args:
        nitro: the handle (the checkpoint record reads its public face).
        run: its parts.
        cadence: where the events fall.
        stops: where the stop flag is read: the run's stop control, or across
            processes the agreed stop (`StopAgreement`), the same on every rank.
    """

    def __init__(
        self, nitro: Nitro, run: RunParts, cadence: StepCadence, stops: Any
    ) -> None:
        self.nitro = nitro
        self.run = run
        self.cadence = cadence
        self.stops = stops
        self.validated: Validation | None = None
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
        run, cadence = self.run, self.cadence
        source = run.data["train"]
        if log.trained >= len(source):
            return False  # the epoch's last step: the epoch end runs what is due
        if cadence.ends_at(step) or self.stops.stop_requested:
            return True  # the epoch end validates and checkpoints, once
        flat: dict[str, Any] = {}
        leave = False
        if cadence.validates_at(step):
            self.validated = validate_midway(run, log.epoch)
            flat, leave = self.validated.flat, self.validated.early
            bar = run.phase.progress()
            if bar is not None:  # the train stretch again, where it stood
                bar.begin(
                    "train",
                    len(source),
                    epoch=log.epoch,
                    max_epochs=run.config.max_epochs,
                )
                for _ in range(log.trained):
                    bar.step()
        leave = leave or self.stops.stop_requested
        if cadence.checkpoints_at(step) and not leave:
            # Where the epoch stands: a resume from this record continues it.
            hold(run.values, held_stop(run.values.state, log))
            write_checkpoint(self.nitro, run, log.epoch, flat, None)
        return leave

    def at(self, step: int) -> Validation | None:
        """The mid-epoch validation run at `step`, if one was."""
        validated = self.validated
        return validated if validated is not None and validated.step == step else None
