"""Ctrl+C as a graceful stop: the first asks the run to stop, the second interrupts.

`StopOnInterrupt(nitro.request_stop)` installs a SIGINT handler for the duration of a
`with` block on the main thread. The first Ctrl+C calls `request_stop()` and prints
one line saying so; the loop leaves at its next step boundary (a standalone evaluation
at its next batch), then validates, checkpoints, finishes the logger and returns with
stop_reason "requested". A second Ctrl+C behaves as it would have without the block:
the previous handler runs, which by default raises KeyboardInterrupt. The previous
handler is restored when the block exits.

Off the main thread, or where SIGINT is ignored, the block installs nothing (Python
delivers signals to the main thread only, and an ignored Ctrl+C stays ignored). Inside
another block it installs nothing either: the outermost block owns Ctrl+C, so an entry
point called inside another (render calling predict) cannot swallow the second press.

The handler does nothing but set flags, call `request_stop` and write its line with
one `os.write`: it runs between two bytecodes of the main thread, which may be holding
a lock or a half-written buffer.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

STOP_MESSAGE = (
    "\njaxnitro: stop requested (Ctrl+C): finishing at the next step boundary, then "
    "validating and checkpointing. Press Ctrl+C again to interrupt at once.\n"
)


class StopOnInterrupt:
    """A `with` block in which Ctrl+C calls `request_stop` instead of interrupting.

    Args:
        request_stop: called on the first SIGINT (a Nitro's `request_stop`).
        message: written to stderr on the first SIGINT; None writes nothing.

    Attributes:
        installed: whether the handler was installed (main thread, SIGINT not ignored).
        requested: whether a first SIGINT arrived.

    Example:
        >>> import signal
        >>> stops = []
        >>> with StopOnInterrupt(lambda: stops.append(1), message=None) as guard:
        ...     signal.raise_signal(signal.SIGINT)
        >>> stops, guard.requested
        ([1], True)
    """

    def __init__(
        self, request_stop: Callable[[], Any], *, message: str | None = STOP_MESSAGE
    ) -> None:
        if not callable(request_stop):
            raise TypeError(
                f"StopOnInterrupt takes the function to call on Ctrl+C, such as "
                f"nitro.request_stop; got {type(request_stop).__name__}."
            )
        self._request_stop = request_stop
        self._message = message
        self._previous: Any = None
        self.installed = False
        self.requested = False

    def __enter__(self) -> StopOnInterrupt:
        if threading.current_thread() is not threading.main_thread():
            return self
        previous = signal.getsignal(signal.SIGINT)
        if previous is signal.SIG_IGN or previous is None:
            return self  # ignored, or installed from outside Python: leave it alone
        if isinstance(getattr(previous, "__self__", None), StopOnInterrupt):
            return self  # nested: the outer block already turns Ctrl+C into a stop
        self._previous = previous
        signal.signal(signal.SIGINT, self._handle)
        self.installed = True
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if not self.installed:
            return
        self.installed = False
        if signal.getsignal(signal.SIGINT) == self._handle:  # nobody replaced ours
            signal.signal(signal.SIGINT, self._previous)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            previous = self._previous
            if callable(previous):
                previous(signum, frame)
                return
            raise KeyboardInterrupt
        self.requested = True
        self._request_stop()
        if self._message:
            with contextlib.suppress(OSError):  # no stderr: the stop still happens
                os.write(2, self._message.encode())
