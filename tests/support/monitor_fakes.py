"""A fake handle and a recording monitor for the observe tests: all the machinery needs
from a Nitro is `current_step`, `current_epoch`, `logger` and a `phase_recorder`.
"""

from __future__ import annotations

from jaxnitro.observe.transitions import PhaseRecorder


class FakeHandle:
    """What the monitors need from a Nitro."""

    def __init__(self, logger: object = "the-logger") -> None:
        self.current_step = 0
        self.current_epoch = 0
        self.logger = logger
        self.phase_recorder = PhaseRecorder(self)


class Recorder:
    """A monitor that records (name, phase, step, epoch, info) for each event."""

    def __init__(self, events: list, name: str) -> None:
        self.events = events
        self.name = name

    def __call__(self, phase, step, epoch, info) -> None:
        self.events.append((self.name, phase, step, epoch, info))


def names(events: list) -> list[tuple[str, str]]:
    return [(name, type(phase).__name__) for name, phase, *_ in events]
