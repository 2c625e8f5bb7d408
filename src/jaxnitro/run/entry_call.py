"""How a handle's public entry point runs: monitors, interrupts, progress, stops.

Every verb of `Nitro` (`train`, `validate`, `evaluate`, `predict`, `render`) runs its
work through `run_entry`: the monitors adopted and Starting / Idle announced around the
outermost call (`observe.entry`), Ctrl+C turned into a stop request and SIGTERM into
a preemption stop (`StopOnInterrupt`), one progress line. A stop request ends with
the call that honoured it; a preemption then raises `Preempted`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import TypeVar

from ..errors import Preempted
from ..observe.entry import entry_point
from ..observe.interrupt import StopOnInterrupt
from ..observe.progress import Progress
from .parts import RunParts
from .view import RunView

T = TypeVar("T")


def run_entry(
    handle: RunView,
    parts: RunParts,
    work: Callable[[], T],
    *,
    request_stop: Callable[[], None],
    stoppable: bool = True,
) -> T:
    """`work()`, run as the public entry point of `handle`.

    Ctrl+C calls `request_stop`; a SIGTERM requests a stop with reason "preempted"
    and, once `work` returned, raises `Preempted`. An entry point that does not stop
    (`stoppable=False`: predict, render) leaves a request made before it pending for
    the next one that does.
    """
    stops = parts.stops
    guard = StopOnInterrupt(
        request_stop, on_terminate=lambda: stops.request(preempted=True)
    )
    pending = stops.stop_requested
    with (
        entry_point(handle),
        guard,
        Progress() as bar,
        parts.phase.showing(bar) as outer,
    ):
        try:
            result = work()
        finally:
            if outer is None and (stoppable or not pending):
                stops.clear()
    if guard.terminated:  # the stop is done: now the process ends, as SIGTERM asks
        raise preempted(handle)
    return result


def preempted(handle: RunView) -> Preempted:
    """The `Preempted` an entry point raises once the stop a SIGTERM asked for is
    done; its message is also written to stderr, since the interpreter exits on a
    `SystemExit` silently."""
    ckpt = handle.checkpointer
    where = f" in {ckpt.dir}" if ckpt is not None and ckpt.dir else ""
    saved = (
        f'its checkpoint is written{where}; continue it with Nitro(e, resume="auto")'
        if handle.stop_reason == "preempted" and ckpt is not None
        else "nothing was checkpointed"
    )
    message = (
        f"jaxnitro: preempted (SIGTERM): stopped at epoch {handle.current_epoch}, step "
        f"{handle.current_step}; {saved}. Exiting with status {Preempted.EXIT_STATUS}."
    )
    with contextlib.suppress(OSError):  # no stderr: the exit still happens
        os.write(2, (message + "\n").encode())
    return Preempted(message, stop_reason=handle.stop_reason)
