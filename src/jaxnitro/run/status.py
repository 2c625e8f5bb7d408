"""`RunStatus`: the host-side account of a run that training keeps besides its state.

The `TrainState` is what the programs change; this is what the loop and the verbs
change around them: the history rows, a pending stop request and how the last
`train()` ended, where a stop cut an epoch, the record whose optimizer state the
next `train()` restores, whether `restore_best` replaced the weights, and what
released the data sources. The handle owns one (`nitro.status`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..checkpoint.lock import RunDirLock
from ..checkpoint.record import CheckpointRecord
from ..observe.profiling import StepProfiler


@dataclass(frozen=True)
class HeldStop:
    """Where a stop cut an epoch, so training again (or a resume) continues it.

    Attributes:
        epoch: the epoch the stop cut (1-based).
        step: the optimizer step the stop left the run at.
        batches: the batches of the epoch trained before the stop; None in a
            record written before it was kept (then it follows from the step).
        loss_sum: the running train loss sum of those batches.
        loss_count: how many micro-batches that sum holds.

    The checkpoint record keeps it as JSON (`RecordHeader.epoch_loss`):

    >>> held = HeldStop(2, 7, 3, 1.5, 3)
    >>> HeldStop.from_json(held.to_json()) == held
    True
    >>> HeldStop.from_json({"epoch": 2}) is None  # damaged or foreign: no stop
    True
    """

    epoch: int
    step: int
    batches: int | None
    loss_sum: float
    loss_count: int

    def to_json(self) -> dict[str, Any]:
        """The record header's form (its keys predate this type)."""
        held: dict[str, Any] = {"epoch": self.epoch, "step": self.step}
        if self.batches is not None:
            held["batches"] = self.batches
        return {**held, "sum": self.loss_sum, "count": self.loss_count}

    @classmethod
    def from_json(cls, value: Any) -> HeldStop | None:
        """The held stop a record's header carries, or None when it carries none
        (or one without the keys a continuation needs)."""
        if not isinstance(value, Mapping):
            return None
        try:
            batches = value.get("batches")
            return cls(
                int(value["epoch"]),
                int(value["step"]),
                None if batches is None else int(batches),
                float(value["sum"]),
                int(value["count"]),
            )
        except (KeyError, TypeError, ValueError):
            return None


EpochEndHook = Callable[[Any, int, dict[str, Any]], "Mapping[str, Any] | None"]
"""`hook(nitro, epoch, observations) -> metrics or None`, called on the host at an
epoch's end, after its validation and before its history row and checkpoint.
`observations` holds `train_loss` (the epoch's mean) and the validation metrics,
flattened; the metrics it returns join them (`Nitro.on_epoch_end`)."""


@dataclass
class RunStatus:
    """The run's mutable bookkeeping, owned by its handle.

    Attributes:
        history: one row per epoch this handle trained (`nitro.history` shows them).
        stop_requested: `request_stop()` was called and not yet honoured.
        preempted: the pending stop request came from a SIGTERM (a preemption).
        stop_reason: how the last `train()` ended ("completed", "early_stop",
            "requested", "preempted", "error"), or None before one ends.
        held_stop: where a stop cut the current epoch (`HeldStop`), so training
            again continues it; None when the last epoch ended whole.
        pending_record: the record whose optimizer state the next `train()`
            restores (a resume, or `restore_optimizer=True`); None once placed.
        restored_best: `restore_best` replaced the trained weights at the end of
            the last `train()`, so this handle will not train further.
        released_by: what released the data sources, once they are released.
        eval_width: the eval programs' batch width: setup probes it (the first
            batch of val, else test, else any split); with no data, the first
            batch evaluated or predicted fixes it.
        profiler: the `profile=` trace of chosen steps, made by the first
            `train()`; None without the keyword.
        step_seconds: the mean wall time of one optimizer step in the last epoch
            trained (its stepping only, not its validation); None before one.
        run_lock: this handle's share of the run directory's lock while it may
            write there (from setup for a resume, else for one `train()`); None
            when it holds none.
        epoch_end_hooks: the functions `Nitro.on_epoch_end` registered, called
            in order at each epoch end (`EpochEndHook`).
    """

    history: list[dict[str, Any]] = field(default_factory=list)
    stop_requested: bool = False
    preempted: bool = False
    stop_reason: str | None = None
    held_stop: HeldStop | None = None
    pending_record: CheckpointRecord | None = None
    restored_best: bool = False
    released_by: str | None = None
    eval_width: int | None = None
    profiler: StepProfiler | None = None
    step_seconds: float | None = None
    run_lock: RunDirLock | None = None
    epoch_end_hooks: list[EpochEndHook] = field(default_factory=list)

    def release_run_lock(self) -> None:
        """Give up the handle's share of the run directory's lock, if it holds one."""
        lock, self.run_lock = self.run_lock, None
        if lock is not None:
            lock.release()
