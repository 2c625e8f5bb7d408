"""How a run stops: the request (`StopControl`) and where a stop cut an epoch
(`HeldStop`).

A stop is asked for by `Nitro.request_stop()`, Ctrl+C, a SIGTERM (a preemption) or a
stop on an evaluation's progress line; the loop reads the request at step
boundaries (`loop.context.StopControl`, the protocol this satisfies); `train()` ends
with a reason and, when the stop cut an epoch, holds where it stood so the next
`train()` (or a resume from the record written then) continues it. Each field is
written through one method of the control: the handle requests and clears, the
training run ends and holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


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

    def is_at(self, epoch: int, step: int) -> bool:
        """Whether this stop left the run at `epoch` and `step` (it still holds)."""
        return self.epoch == epoch and self.step == step


class StopControl:
    """A run's stop: the pending request, how the last `train()` ended, and where
    a stop cut the current epoch.

    >>> stops = StopControl()
    >>> stops.request(preempted=True)
    >>> stops.stop_requested, stops.preempted
    (True, True)
    >>> stops.clear(); stops.stop_requested
    False
    """

    def __init__(self, held: HeldStop | None = None) -> None:
        self._requested = False
        self._preempted = False
        self._reason: str | None = None
        self._held = held

    @property
    def stop_requested(self) -> bool:
        """A stop was asked for and not yet honoured by an outermost entry point."""
        return self._requested

    @property
    def preempted(self) -> bool:
        """The pending request came from a SIGTERM (a preemption)."""
        return self._preempted

    @property
    def reason(self) -> str | None:
        """How the last `train()` ended ("completed", "early_stop", "requested",
        "preempted", "error"), or None before one ended (or while one runs)."""
        return self._reason

    @property
    def held(self) -> HeldStop | None:
        """Where a stop cut the current epoch; None when the last epoch ended whole."""
        return self._held

    def request(self, *, preempted: bool = False) -> None:
        """Ask the running (or next) entry point to stop; `preempted`: a SIGTERM's."""
        self._requested = True
        self._preempted = self._preempted or preempted

    def clear(self) -> None:
        """Drop the request: the outermost entry point that honoured it returned."""
        self._requested = self._preempted = False

    def begin(self) -> None:
        """A `train()` starts: no reason until it ends (a pending request stays)."""
        self._reason = None

    def end(self, reason: str) -> None:
        """A `train()` ended, for `reason`."""
        self._reason = reason

    def hold(self, held: HeldStop | None) -> None:
        """Where the epoch just ended stands: cut by a stop (`held`) or whole."""
        self._held = held
