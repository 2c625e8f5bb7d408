"""How a run stops: the request and how the last `train()` ended (`StopControl`).

A stop is asked for by `Nitro.request_stop()`, Ctrl+C, a SIGTERM (a preemption) or a
stop on an evaluation's progress line; the loop reads the request at step
boundaries (`loop.context.StopControl`, the protocol this satisfies); `train()` ends
with a reason. Where a stop cut an epoch travels with the training state
(`TrainState.held`, `loop/state.py`), not here. Each field is written through one
method of the control: the handle requests and clears, the training run begins and
ends.
"""

from __future__ import annotations


class StopControl:
    """A run's stop: the pending request and how the last `train()` ended.

    >>> stops = StopControl()
    >>> stops.request(preempted=True)
    >>> stops.stop_requested, stops.preempted
    (True, True)
    >>> stops.clear(); stops.stop_requested
    False
    """

    def __init__(self) -> None:
        self._requested = False
        self._preempted = False
        self._reason: str | None = None

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
