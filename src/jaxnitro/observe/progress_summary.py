"""The plain-text progress reporter: for output nobody watches live.

A log file, `nohup`, SLURM, a CI job: stderr is no terminal, so no bar is drawn, and
a redrawn line would only litter the file. This reporter writes plain lines instead:
each epoch's summary, `epoch 3/40: train_loss 0.4123 · val acc 0.9031 · 2.1 s`, and
while a stretch runs, a progress line at most every `interval_s` seconds (30 by
default) since the last line written, so a long epoch is never silent::

    epoch 3/40: train 1200/5000 · loss 0.4123 · val acc 0.9 · 41.2 steps/s · ETA 1:32:05

The progress line holds the stretch and its epoch, the units done of its total (a
batch each: an optimizer step, a micro-batch under accumulation, an eval batch), the
phase and note when there are any, the values the loop shows (the latest train loss,
the monitored validation metric), the rate since the previous line, and the ETA of
the run (of the stretch, outside training) at that rate. Epochs shorter than the
interval get their summary lines only. The lines are written at events the loop
sends anyway (a step, a phase, a note): the reporter reads a clock per event and
nothing else. `interval_s=None` keeps the summary lines only;
`jaxnitro.progress_reporter(None)` turns everything off.

Example:
    >>> import io
    >>> out, now = io.StringIO(), [0.0]
    >>> reporter = SummaryReporter(stream=out, interval_s=30, clock=lambda: now[0])
    >>> reporter("begin", "train", 100, 1, 2)
    >>> for second in range(1, 41):  # one step a second
    ...     now[0] = float(second)
    ...     reporter("step", "", 0, 0, 0)
    >>> reporter("epoch", "epoch 1/2: train_loss 0.5 · 100.0 s", 0, 1, 2)
    >>> print(out.getvalue().rstrip())
    epoch 1/2: train 30/100 · 1.0 steps/s · ETA 2:50
    epoch 1/2: train_loss 0.5 · 100.0 s
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import TextIO

from ..errors import ConfigError
from .number_format import format_clock, format_number
from .progress_line import ProgressLine, stretch_name

PROGRESS_EVERY_S = 30.0
"""The default least time between two lines, a progress line and the one before."""

BAD_INTERVAL = (
    "SummaryReporter interval_s must be a number of seconds > 0, or None for no "
    "progress lines (the per-epoch lines only); got {value!r}. E.g. "
    "jaxnitro.progress_summary_reporter.interval_s = 60."
)


def _checked_interval(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(BAD_INTERVAL.format(value=value))
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(BAD_INTERVAL.format(value=value))
    return float(value)


class SummaryReporter:
    """A progress reporter writing plain lines: each epoch's summary ("epoch" verb),
    and a progress line at most every `interval_s` seconds while a stretch runs.

    Args:
        stream: where lines go; default `sys.stderr`, read at each write (so a
            redirected or captured stderr receives them).
        interval_s: the least seconds between a progress line and the line before
            it (either kind); None writes no progress lines. Settable later, as
            `jaxnitro.progress_summary_reporter.interval_s = 60`.
        clock: the time source (seconds), for tests.

    Raises:
        ConfigError: `interval_s` is neither None nor a finite number > 0.
    """

    def __init__(
        self,
        *,
        stream: TextIO | None = None,
        interval_s: float | None = PROGRESS_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stream = stream
        self._interval = _checked_interval(interval_s)
        self._clock = clock
        self._line = ProgressLine()
        self._open = False
        self._written = float("-inf")  # when the last line went out
        self._since: tuple[float, int, float] | None = None  # the rate's window

    @property
    def interval_s(self) -> float | None:
        """The least seconds between two lines; None: no progress lines."""
        return self._interval

    @interval_s.setter
    def interval_s(self, value: float | None) -> None:
        self._interval = _checked_interval(value)

    def __call__(
        self, verb: str, label: str, total: int, epoch: int, max_epochs: int
    ) -> None:
        line = self._line
        if verb == "begin":
            if not self._open:  # an entry point starts: its lines count from here
                self._open = True
                self._written = self._clock()
            line.begin(label, total, epoch, max_epochs)
            self._since = None
        elif verb == "epoch":
            self._write(label)
        elif not self._open:
            return  # a stray event between entry points
        elif verb == "step":
            line.step()
            if self._interval is not None:
                self._at_step(self._interval)
        elif verb == "phase":
            line.set_phase(label)
            self._write_due()
        elif verb == "note":
            line.note = label
            self._write_due()
        elif verb == "metrics":
            line.values = label
        elif verb == "done":
            self._open = False
            self._line = ProgressLine()
            self._since = None
        # "end" writes nothing; unknown verbs are ignored

    def advance(self, count: int) -> None:
        """`count` "step" events at once (a progress line written at most once)."""
        if not self._open:
            return
        self._line.step(count)
        if self._interval is not None:
            self._at_step(self._interval)

    def _at_step(self, interval: float) -> None:
        now = self._clock()
        if self._since is None:  # the rate counts from the stretch's first step,
            self._since = (now, self._line.done, self._fraction())  # past compiles
        if now - self._written >= interval:
            self._write(self.progress_text(now))

    def _write_due(self) -> None:
        if self._interval is not None:
            now = self._clock()
            if now - self._written >= self._interval:
                self._write(self.progress_text(now))

    def _fraction(self) -> float:
        fraction = self._line.fraction
        return 0.0 if fraction is None else fraction

    def progress_text(self, now: float) -> str:
        """The progress line as it reads at time `now` (a `clock()` reading)."""
        line = self._line
        text = stretch_name(line.label, line.epoch, line.max_epochs)
        if line.total > 0:
            text += f" {line.done}/{line.total}"
        elif line.done > 0:
            text += f" {line.done}"
        if line.phase:
            text += f" [{line.phase}]"
        if line.note:
            text += f" ({line.note})"
        parts = [text]
        if line.values:
            parts.append(line.values)
        since = self._since
        if since is not None and now > since[0]:
            seconds = now - since[0]
            units = line.done - since[1]
            if units > 0:
                unit = "steps" if line.label == "train" else "batches"
                parts.append(f"{format_number(units / seconds)} {unit}/s")
            moved = self._fraction() - since[2]
            if moved > 0:
                left = (1.0 - self._fraction()) * seconds / moved
                parts.append(f"ETA {format_clock(left)}")
        return " · ".join(parts)

    def _write(self, text: str) -> None:
        now = self._clock()
        self._written = now
        if self._since is not None:  # the next line's rate is that window's
            self._since = (now, self._line.done, self._fraction())
        stream = self._stream if self._stream is not None else sys.stderr
        if stream is None:  # pythonw: no stderr at all
            return
        stream.write(text + "\n")
        stream.flush()
