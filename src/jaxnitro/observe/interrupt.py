"""Ctrl+C and SIGTERM as a graceful stop: the first asks the run to stop, the second
ends it at once.

`StopOnInterrupt(nitro.request_stop)` installs SIGINT and SIGTERM handlers for the
duration of a `with` block on the main thread. The first Ctrl+C calls
`request_stop()` and prints one line saying so; the loop leaves at its next step
boundary (a standalone evaluation at its next batch), then validates, checkpoints,
finishes the logger and returns with stop_reason "requested". The first SIGTERM (what
a cluster scheduler sends before it preempts a job) does the same through
`on_terminate` (the run's stop_reason is then "preempted") and sets `terminated`, so
the entry point can end the process once the checkpoint is written (it raises
`Preempted`, exit status 143).

A second Ctrl+C or SIGTERM during that stop ends the call at once. Where the signal's
previous handler is the user's own, it runs. Otherwise, in a script, the block raises
`SystemExit(128 + signal)` (130 for Ctrl+C, 143 for SIGTERM) after one line saying so:
the process exits without a traceback, running only its `finally` blocks. In an
interactive session (a REPL, IPython, Jupyter) a second Ctrl+C raises
KeyboardInterrupt instead, which interrupts the cell and keeps the session. The
previous handlers are restored when the block exits.

Off the main thread, or for a signal that is ignored, the block installs nothing
(Python delivers signals to the main thread only, and an ignored signal stays
ignored). Inside another block it installs nothing either: the outermost block owns
the signals, so an entry point called inside another (render calling predict) cannot
swallow the second press.

The handler does nothing but set flags, call `request_stop` and write its line with
one `os.write`: it runs between two bytecodes of the main thread, which may be holding
a lock or a half-written buffer.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

STOP_MESSAGE = (
    "\njaxnitro: stop requested (Ctrl+C): finishing at the next step boundary, then "
    "validating and checkpointing. Press Ctrl+C again to interrupt at once.\n"
)
TERMINATE_MESSAGE = (
    "\njaxnitro: SIGTERM received (preemption): finishing at the next step boundary, "
    "then validating, checkpointing and exiting with status 143. A second SIGTERM or "
    "Ctrl+C exits at once.\n"
)
EXIT_NOW_MESSAGE = (
    "\njaxnitro: second {name} during the graceful stop: exiting at once with "
    "status {status}, without the checkpoint.\n"
)
_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_NAMES: dict[int, str] = {signal.SIGINT: "Ctrl+C", signal.SIGTERM: "SIGTERM"}


class StopOnInterrupt:
    """A `with` block in which Ctrl+C and SIGTERM call `request_stop` instead of
    ending the program.

    Args:
        request_stop: called on the first SIGINT (a Nitro's `request_stop`), and on
            the first SIGTERM when `on_terminate` is None.
        message: written to stderr on the first SIGINT; None writes nothing.
        on_terminate: called on the first SIGTERM instead of `request_stop`.
        terminate_message: written to stderr on the first SIGTERM; None writes
            nothing.

    Attributes:
        installed: whether the SIGINT handler was installed (main thread, SIGINT
            not ignored).
        requested: whether a first SIGINT or SIGTERM arrived.
        terminated: whether that first signal was a SIGTERM.

    Examples:
        >>> import signal
        >>> stops = []
        >>> with StopOnInterrupt(lambda: stops.append(1), message=None) as guard:
        ...     signal.raise_signal(signal.SIGINT)
        >>> stops, guard.requested, guard.terminated
        ([1], True, False)
    """

    def __init__(
        self,
        request_stop: Callable[[], Any],
        *,
        message: str | None = STOP_MESSAGE,
        on_terminate: Callable[[], Any] | None = None,
        terminate_message: str | None = TERMINATE_MESSAGE,
    ) -> None:
        if not callable(request_stop):
            raise TypeError(
                f"StopOnInterrupt takes the function to call on Ctrl+C, such as "
                f"nitro.request_stop; got {type(request_stop).__name__}."
            )
        if on_terminate is not None and not callable(on_terminate):
            raise TypeError(
                f"StopOnInterrupt(on_terminate=...) takes the function to call on "
                f"SIGTERM, or None; got {type(on_terminate).__name__}."
            )
        self._request_stop = request_stop
        self._on_terminate = on_terminate or request_stop
        self._messages: dict[int, str | None] = {
            signal.SIGINT: message,
            signal.SIGTERM: terminate_message,
        }
        self._previous: dict[int, Any] = {}
        self.installed = False
        self.requested = False
        self.terminated = False

    def __enter__(self) -> StopOnInterrupt:
        if threading.current_thread() is not threading.main_thread():
            return self
        for signum in _SIGNALS:
            previous = signal.getsignal(signum)
            if previous is signal.SIG_IGN or previous is None:
                continue  # ignored, or installed from outside Python: leave it alone
            if isinstance(getattr(previous, "__self__", None), StopOnInterrupt):
                continue  # nested: the outer block already turns it into a stop
            self._previous[signum] = previous
            signal.signal(signum, self._handle)
        self.installed = signal.SIGINT in self._previous
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.installed = False
        previous, self._previous = self._previous, {}
        for signum, handler in previous.items():
            if signal.getsignal(signum) == self._handle:  # nobody replaced ours
                signal.signal(signum, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            self._end_now(signum, frame)
            return
        self.requested = True
        if signum == signal.SIGTERM:
            self.terminated = True
            self._on_terminate()
        else:
            self._request_stop()
        _say(self._messages.get(signum))

    def _end_now(self, signum: int, frame: FrameType | None) -> None:
        """A second signal during the stop: the previous handler if it is the
        user's own, else KeyboardInterrupt in an interactive session (it keeps the
        session), else SystemExit without a traceback."""
        previous = self._previous.get(signum)
        if callable(previous) and previous is not signal.default_int_handler:
            previous(signum, frame)
            return
        if signum == signal.SIGINT and _is_interactive():
            raise KeyboardInterrupt
        status = 128 + signum
        _say(EXIT_NOW_MESSAGE.format(name=_NAMES[signum], status=status))
        raise SystemExit(status)


def _say(text: str | None) -> None:
    if text:
        with contextlib.suppress(OSError):  # no stderr: the stop still happens
            os.write(2, text.encode())


def _is_interactive() -> bool:
    """Whether a person is at a prompt (a REPL, IPython, a Jupyter kernel), where an
    exit would end their session rather than their program."""
    if hasattr(sys, "ps1") or sys.flags.interactive:
        return True
    ipython = sys.modules.get("IPython")  # imported is not running: ask it
    get_ipython = getattr(ipython, "get_ipython", None)
    return callable(get_ipython) and get_ipython() is not None
