"""`RunStatus`: what training counted of a run, besides its state.

The `TrainState` is what the programs change; this is what `run/training.py` records
around them, and only it writes here: the history rows (`nitro.history` shows
them), the mean step time of the last epoch (the next epoch's `steps_per_call="auto"`
and `cost_report` read it), and the `profile=` trace. How a run stops lives in
`run/stops.py`, its phase in `run/phase.py`, its weights and their provenance in
`run/values.py`, the run directory's lock in `run/run_lock.py`, the release of its
sources in `run/release.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..observe.profiling import StepProfiler

EpochEndHook = Callable[[Any, int, dict[str, Any]], "Mapping[str, Any] | None"]
"""`hook(nitro, epoch, observations) -> metrics or None`, called on the host at an
epoch's end, after its validation and before its history row and checkpoint.
`observations` holds `train_loss` (the epoch's mean) and the validation metrics,
flattened; the metrics it returns join them (`Nitro.on_epoch_end`)."""


@dataclass
class RunStatus:
    """What training counted, owned by the handle (`nitro.status`).

    Attributes:
        history: one row per epoch this handle trained (`nitro.history` shows them).
        step_seconds: the mean wall time of one optimizer step in the last epoch
            trained (its stepping only, not its validation); None before one.
        auto_steps_per_call: the count steps_per_call="auto" chose from the
            handle's first epoch of more than one call (its steps after the first
            call, timed by the loop), or took at its first train() from a handle
            of the same train program that ran it in the process
            (`loop.call_count`); kept for the handle: a new count may compile
            another program. None before, and with a count set.
        profiler: the `profile=` trace of chosen steps, made by the first
            `train()`; None without the keyword.
    """

    history: list[dict[str, Any]] = field(default_factory=list)
    step_seconds: float | None = None
    auto_steps_per_call: int | None = None
    profiler: StepProfiler | None = None
