"""The entry-point depth counter: Starting and Idle once per outermost public call.

Every public entry point (`Nitro(e)`, `train`, `validate`, `evaluate`, `predict`,
export) runs inside `entry_point(...)`. The process counts how many are in flight
(`work_in_flight()`); only the outermost one publishes Starting when it begins and
Idle when it returns, so `train()` validating each epoch does not announce an idle
session mid-run. Entering also copies the module-level monitors into the handle.

An entry point without a handle yet (`Nitro(e)` during setup) publishes Starting to
the module-level monitors and attaches the handle once it exists (`entry.attach`);
Idle then goes through the handle. One that raises before it has a handle publishes
no Idle and leaves the last published phase in place.

Example:
    >>> work_in_flight()
    False
    >>> with entry_point() as entry:
    ...     work_in_flight()
    True
    >>> work_in_flight()
    False
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .monitors import module_registry
from .phases import Idle, Starting
from .transitions import PhaseRecorder, publish_phase, recorder_of

_lock = threading.Lock()
_depth = 0
_local = threading.local()


class EntryPoint:
    """One call of a public entry point, as the depth counter sees it.

    Attributes:
        recorder: the recorder of the handle this call works on, once known.
        outermost: whether this call took the process from idle to busy.
    """

    def __init__(self, *, outermost: bool) -> None:
        self.recorder: PhaseRecorder | None = None
        self.outermost = outermost

    def attach(self, nitro: Any) -> None:
        """Name the handle this call works on; copies the module-level monitors.

        The enclosing calls on this thread that have no handle yet take it too, so
        `jaxnitro.train(e)` announces Idle through the handle it built.
        """
        recorder = recorder_of(nitro)
        recorder.monitors.adopt(module_registry())
        if self.recorder is None:
            self.recorder = recorder
        for frame in _frames():
            if frame.recorder is None:
                frame.recorder = recorder


def _frames() -> list[EntryPoint]:
    frames: list[EntryPoint] | None = getattr(_local, "frames", None)
    if frames is None:
        frames = _local.frames = []
    return frames


@contextmanager
def entry_point(nitro: Any = None) -> Iterator[EntryPoint]:
    """Run a public entry point: count it, and announce Starting and Idle if outermost.

    Args:
        nitro: the handle the call works on, if it exists already (else attach it).
    """
    global _depth
    with _lock:
        outermost = _depth == 0
        _depth += 1
    entry = EntryPoint(outermost=outermost)
    frames = _frames()
    frames.append(entry)
    finished = False
    try:
        if nitro is not None:
            entry.attach(nitro)
        if outermost:
            if entry.recorder is not None:
                entry.recorder.publish(Starting())
            else:
                publish_phase(Starting())
        yield entry
        finished = True
    finally:
        frames.remove(entry)
        with _lock:
            _depth -= 1
            last = _depth == 0
        if last:  # the counter is already down: a monitor sees work_in_flight() False
            if entry.recorder is not None:
                entry.recorder.publish(Idle())
            elif finished:
                publish_phase(Idle())


def work_in_flight() -> bool:
    """Whether any public entry point is executing in this process.

    False is the state Idle announces. A monitor polling on an interval should check
    it too: an entry point that raised before it had a handle published no Idle.
    """
    return _depth > 0
