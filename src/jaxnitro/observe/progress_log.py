"""The log-record progress reporter: for environments that show log records.

Records go to the `jaxnitro.progress` logger at INFO, one id per entry point: opened at
the first "begin", closed at "done". Each record's message is the line as the bar
would draw it, prefixed by the fraction (`' 42% epoch 3/40: train'`), and it carries
`record.progress`, a dict `{"id", "name", "fraction", "done"}` for a handler that
draws its own display. Records are written at each stretch's start, each phase, and
the end, and each epoch's summary; steps, notes and the shown values (the latest
train loss) at most once per `interval_s`, so a log is not flooded.

Example:
    >>> import logging, io
    >>> stream = io.StringIO()
    >>> handler = logging.StreamHandler(stream)
    >>> logger = logging.getLogger("doctest.progress")
    >>> logger.addHandler(handler); logger.setLevel(logging.INFO)
    >>> reporter = LogReporter(logger)
    >>> reporter("begin", "train", 2, 1, 2)
    >>> reporter("step", "", 0, 0, 0); reporter("step", "", 0, 0, 0)  # within 5 s
    >>> reporter("done", "", 0, 0, 0)
    >>> print(stream.getvalue().rstrip())
      0% epoch 1/2: train
     50% done: 1/2 epochs
    >>> logger.removeHandler(handler)
"""

from __future__ import annotations

import itertools
import logging
import time
from typing import Any

from .progress_line import ProgressLine

LOGGER_NAME = "jaxnitro.progress"
"""The logger progress records go to."""

INTERVAL_S = 5.0
"""Steps and notes are written at most this often."""

_ids = itertools.count(1)


def is_log_shown(logger: logging.Logger | None = None) -> bool:
    """Whether an INFO record on `logger` (default `jaxnitro.progress`) reaches a
    handler that shows it: the logger is enabled for INFO and a handler on it or an
    ancestor it propagates to has a level of INFO or below. Python's last-resort
    handler, which shows warnings when nothing is configured, does not count.
    """
    if logger is None:
        logger = logging.getLogger(LOGGER_NAME)
    if not logger.isEnabledFor(logging.INFO):
        return False
    current: logging.Logger | None = logger
    while current is not None:
        if any(handler.level <= logging.INFO for handler in current.handlers):
            return True
        if not current.propagate:
            return False
        current = current.parent
    return False


class LogReporter:
    """A progress reporter writing log records.

    Args:
        logger: where records go; default the `jaxnitro.progress` logger.
        interval_s: the least time between two records for steps or notes.
        clock: the time source (seconds), for tests.
    """

    def __init__(
        self,
        logger: logging.Logger | None = None,
        *,
        interval_s: float = INTERVAL_S,
        clock: Any = time.monotonic,
    ) -> None:
        self._logger = logger if logger is not None else logging.getLogger(LOGGER_NAME)
        self._interval = interval_s
        self._clock = clock
        self._line = ProgressLine()
        self._id: int | None = None
        self._written = float("-inf")

    def __call__(
        self, verb: str, label: str, total: int, epoch: int, max_epochs: int
    ) -> None:
        line = self._line
        if verb == "begin":
            if self._id is None:
                self._id = next(_ids)
            line.begin(label, total, epoch, max_epochs)
            self._write(line.description())
        elif self._id is None:
            return  # nothing opened: a stray event between entry points
        elif verb == "step":
            line.step()
            self._write_throttled()
        elif verb == "phase":
            line.set_phase(label)
            self._write(line.description())
        elif verb == "note":
            line.note = label
            self._write_throttled()
        elif verb == "metrics":
            line.values = label
            self._write_throttled()
        elif verb == "epoch":
            self._write(label)
        elif verb == "done":
            self._write(line.closing(label), done=True)
            self._id = None
            self._line = ProgressLine()
        # "end" writes nothing: the next stretch or "done" says where the run is

    def advance(self, count: int) -> None:
        """`count` "step" events at once (a record written at most once)."""
        if self._id is None:
            return
        self._line.step(count)
        self._write_throttled()

    def _write_throttled(self) -> None:
        if self._clock() - self._written >= self._interval:
            self._write(self._line.description())

    def _write(self, name: str, *, done: bool = False) -> None:
        self._written = self._clock()
        fraction = self._line.fraction
        if done and fraction is None:
            fraction = 1.0
        shown = "    " if fraction is None else f"{fraction:4.0%}"
        self._logger.info(
            "%s %s",
            shown,
            name,
            extra={
                "progress": {
                    "id": self._id,
                    "name": name,
                    "fraction": fraction,
                    "done": done,
                }
            },
        )
