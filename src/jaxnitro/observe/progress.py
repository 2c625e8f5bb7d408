"""Progress reporting: the reporter protocol, the default choice, and the loop's driver.

A reporter is `f(verb, label, total, epoch, max_epochs)`, with verb one of:

* "begin": once per stretch of work, with its label ("train", a split name, "setup"),
  its total units (0 when unknown) and its epoch position (0, 0 outside training);
* "step": once per completed unit (an optimizer step, an eval batch);
* "end": once when the stretch finishes, however it finishes;
* "done": once when the last stretch of an entry point is over, with the closing
  text as label ("" for the default, `done: 40/40 epochs`);
* "phase": when the stretch starts or stops doing something that produces no units;
  label names it ("compiling gradient") or is "" when ordinary work resumes;
* "note": when the note user code set changes; label is the note, "" for none;
* "metrics": when the values the line shows change (the latest train loss each
  step, the monitored validation metric after each validation); label is their
  text, `loss 0.4123 · val acc 0.9031`;
* "epoch": once per trained epoch, after its validation; label is its summary line,
  `epoch 3/40: train_loss 0.4123 · val acc 0.9031 · 2.1 s`.

A reporter may also have a method `advance(count)`: `count` "step" events at once.
The training loop reports a call of several steps that way (the built-in reporters
have it); a reporter without it gets `count` "step" calls.

A new "phase" or "begin" clears the note. `progress_reporter(f)` installs one and
returns the previous; None switches progress off, the bar and the per-epoch summary
lines alike. A reporter should ignore a verb it does not know. A reporter that raises
is switched off with a warning, and the run goes on.

The loop drives it through `Progress`, one per entry point::

    with Progress() as progress:
        progress.begin("train", len(loader), epoch=3, max_epochs=40)
        progress.phase("compiling gradient"); ...; progress.phase("")
        progress.step()                         # per optimizer step
        progress.end()
    # leaving the block sends "done"; an exception closes the line as "failed: ..."
"""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Protocol

from ..devices.distributed import is_rank0
from ..errors import NitroWarning
from .progress_bar import BarReporter, is_terminal_session
from .progress_line import epoch_summary, format_values, stretch_name
from .progress_log import LogReporter, is_log_shown
from .progress_notes import NoteStack
from .progress_summary import SummaryReporter

SHOW_INTERVAL_S = 0.1
"""The least time between two throttled updates of the shown values."""

VERBS = ("begin", "step", "end", "done", "phase", "note", "metrics", "epoch")


class ProgressReporter(Protocol):
    """`f(verb, label, total, epoch, max_epochs)`; the return value is ignored."""

    def __call__(
        self, verb: str, label: str, total: int, epoch: int, max_epochs: int
    ) -> object: ...


progress_bar_reporter = BarReporter()
"""The terminal reporter: one rich bar per entry point. Draws only when a person
watches stderr (`is_terminal_session()`)."""

progress_log_reporter = LogReporter()
"""The log-record reporter: INFO records on the `jaxnitro.progress` logger."""

progress_summary_reporter = SummaryReporter()
"""The non-terminal reporter: one summary line per epoch on stderr, and a progress
line at most every `progress_summary_reporter.interval_s` seconds (30; None: none)."""


class DefaultReporter:
    """Picks a reporter at each stretch's "begin", and keeps it for the stretch.

    In order: `progress_bar_reporter` when stderr is a terminal
    (`is_terminal_session()`); `progress_log_reporter` when a logging handler would
    show INFO records of `jaxnitro.progress` (`is_log_shown()`);
    `progress_summary_reporter` otherwise (a log file, `nohup`, SLURM, CI), which
    writes one line per epoch to stderr and, during an epoch, a progress line (units
    done, loss, rate, ETA) at most every 30 s: set
    `progress_summary_reporter.interval_s` to change it. On a terminal the bar keeps
    each epoch's line on screen above it. `progress_reporter(None)` turns all of it
    off.
    """

    def __init__(
        self,
        bar: ProgressReporter | None = None,
        log: ProgressReporter | None = None,
        summary: ProgressReporter | None = None,
    ) -> None:
        self._bar = progress_bar_reporter if bar is None else bar
        self._log = progress_log_reporter if log is None else log
        self._summary = progress_summary_reporter if summary is None else summary
        self._choice: ProgressReporter | None = None

    def choose(self) -> ProgressReporter | None:
        """The reporter a stretch beginning now would get."""
        if is_terminal_session():
            return self._bar
        if is_log_shown():
            return self._log
        return self._summary

    @property
    def choice(self) -> ProgressReporter | None:
        """The reporter the current stretch got (None: nothing shown)."""
        return self._choice

    def __call__(
        self, verb: str, label: str, total: int, epoch: int, max_epochs: int
    ) -> None:
        if verb == "begin":
            choice = self.choose()
            previous = self._choice
            if previous is not None and previous is not choice:
                previous("done", "", 0, 0, 0)  # close its line before switching
            self._choice = choice
        choice = self._choice
        if choice is not None:
            choice(verb, label, total, epoch, max_epochs)
        if verb == "done":
            self._choice = None

    def advance(self, count: int) -> None:
        """`count` units completed: the chosen reporter's `advance`, or its "step"
        `count` times."""
        choice = self._choice
        if choice is None:
            return
        advance = getattr(choice, "advance", None)
        if advance is not None:
            advance(count)
            return
        for _ in range(count):
            choice("step", "", 0, 0, 0)


default_progress_reporter = DefaultReporter()
"""The reporter installed at import; see `DefaultReporter`."""

_reporter: ProgressReporter | None = default_progress_reporter
_notes = NoteStack()
_note_lock = threading.Lock()
_last_note = ""
_drivers_lock = threading.Lock()
_drivers = 0


def progress_reporter(f: ProgressReporter | None) -> ProgressReporter | None:
    """Install `f` as the progress reporter; return the previous one.

    None switches progress output off; `default_progress_reporter` is the default.
    `f` is called as `f(verb, label, total, epoch, max_epochs)` with the verbs the
    module describes ("begin", "step", "end", "done", "phase", "note").

    A reporter that raises is switched off with a `NitroWarning` and the run goes
    on. It then gets one trailing `f("done", "", 0, 0, 0)`, so a reporter drawing
    a live line or bar can close it (an error from that call is ignored), and no
    call after that; `current_progress_reporter()` is None until one is installed.

    Args:
        f: the reporter, or None for no progress output.

    Returns:
        The reporter installed before (None when progress was off).

    Raises:
        TypeError: `f` is neither callable nor None.

    Examples:
        >>> seen = []
        >>> previous = progress_reporter(lambda verb, label, *rest: seen.append(verb))
        >>> with Progress() as progress:
        ...     progress.begin("train", 2)
        ...     progress.step()
        >>> _ = progress_reporter(previous)
        >>> seen
        ['begin', 'step', 'end', 'done']
    """
    global _reporter
    if f is not None and not callable(f):
        raise TypeError(
            f"progress_reporter takes f(verb, label, total, epoch, max_epochs) or None "
            f"(progress off); got {type(f).__name__} {f!r}."
        )
    previous, _reporter = _reporter, f
    return previous


def current_progress_reporter() -> ProgressReporter | None:
    """The reporter installed now (None: progress is off)."""
    return _reporter


def report_progress(
    verb: str, label: str = "", total: int = 0, epoch: int = 0, max_epochs: int = 0
) -> None:
    """Send one event to the current reporter; one that raises is switched off."""
    f = _reporter
    if f is None or not is_rank0():  # rank 0 shows a run across processes
        return
    try:
        f(verb, label, total, epoch, max_epochs)
    except Exception as error:
        _switch_off(f, error, verb)


def report_steps(
    count: int, label: str, total: int, epoch: int, max_epochs: int
) -> None:
    """`count` "step" events at once: one `advance(count)` call for a reporter that
    has that method (the built-in ones do), else `count` "step" calls. The calls
    loop reports a call's steps together, so the line costs it a call, not a step.
    """
    f = _reporter
    if f is None or count <= 0 or not is_rank0():
        return
    advance = getattr(f, "advance", None)
    if advance is None:
        for _ in range(count):
            report_progress("step", label, total, epoch, max_epochs)
        return
    try:
        advance(count)
    except Exception as error:
        _switch_off(f, error, "step")


def _switch_off(f: ProgressReporter, error: Exception, verb: str) -> None:
    """Switch off reporter `f`, which raised `error` on `verb`, with a warning."""
    global _reporter
    if _reporter is f:
        _reporter = None
    with contextlib.suppress(Exception):  # let it close a live display
        f("done", "", 0, 0, 0)
    warnings.warn(
        f"Progress reporter {_name(f)} raised {type(error).__name__}: {error} on "
        f"verb {verb!r}. It is switched off and the run goes on. Fix it and "
        f"install it again with progress_reporter(f), or pass None to run without "
        f"progress output.",
        NitroWarning,
        stacklevel=4,
    )


def progress_note(msg: str) -> None:
    """Show `msg` beside the current phase, as `setup [building data] (msg)`.

    Inside `with_progress_note` it replaces that block's note; outside one it lasts
    until the next phase or stretch. Cheap enough to call per item: the bar redraws
    at most ten times a second, and the log reporter writes notes at most once per
    interval.
    """
    _deliver(_notes.set(str(msg)))


@contextmanager
def with_progress_note(msg: str) -> Iterator[None]:
    """Show `msg` beside the current phase for the block, then restore the note.

    Blocks nest and the innermost is shown. A new phase or stretch clears every note,
    including those of blocks still open.

    Examples:
        >>> files = ["a.bin", "b.bin"]
        >>> with with_progress_note("loading index"):
        ...     for i, name in enumerate(files, 1):
        ...         with with_progress_note(f"decoding {i}/{len(files)}"):
        ...             pass
    """
    token = _notes.push(str(msg))
    _deliver(_notes.shown())
    try:
        yield
    finally:
        _deliver(_notes.pop(token))


def _deliver(note: str) -> None:
    global _last_note
    with _note_lock:
        if note == _last_note:
            return
        _last_note = note
    report_progress("note", note)


def _clear_notes() -> None:
    global _last_note
    _notes.clear()
    with _note_lock:
        _last_note = ""


class Progress:
    """The loop's handle on the progress display: one per entry point.

    Use it as a context manager around the entry point's work. A nested one (an
    entry point called inside another) shares the outer line: its "done" is not sent.
    """

    def __init__(self) -> None:
        self._label = ""
        self._total = 0
        self._epoch = 0
        self._max_epochs = 0
        self._open = False
        self._closed = False
        self._nested = False
        self._values: dict[str, float] = {}
        self._shown_at = float("-inf")

    def __enter__(self) -> Progress:
        global _drivers
        with _drivers_lock:
            self._nested = _drivers > 0
            _drivers += 1
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        global _drivers
        try:
            if error is None:
                self.done()
            else:
                word = (
                    "interrupted" if isinstance(error, KeyboardInterrupt) else "failed"
                )
                where = stretch_name(self._label, self._epoch, self._max_epochs)
                self.done(f"{word}: {where}" if where else word)
        finally:
            with _drivers_lock:
                _drivers -= 1

    def begin(
        self, label: str, total: int = 0, *, epoch: int = 0, max_epochs: int = 0
    ) -> None:
        """A stretch begins: `label`, its units (0 if unknown), its epoch position.

        An open stretch is ended first. Clears the note.
        """
        if self._open:
            self.end()
        _clear_notes()
        self._label, self._total = label, total
        self._epoch, self._max_epochs = epoch, max_epochs
        self._open = True
        report_progress("begin", label, total, epoch, max_epochs)

    def step(self) -> None:
        """One unit of the stretch completed (an optimizer step, an eval batch)."""
        if _reporter is not None:
            report_progress(
                "step", self._label, self._total, self._epoch, self._max_epochs
            )

    def steps(self, count: int) -> None:
        """`count` units completed at once, as `count` `step()` calls would report
        them (one event for a reporter with an `advance(count)` method)."""
        if _reporter is not None:
            report_steps(count, self._label, self._total, self._epoch, self._max_epochs)

    def end(self) -> None:
        """The stretch finished (a no-op when none is open)."""
        if not self._open:
            return
        self._open = False
        report_progress("end", self._label, self._total, self._epoch, self._max_epochs)

    def show(self, values: dict[str, float], *, throttle: bool = False) -> None:
        """Show `values` on the line from now on (merged by name with those shown),
        e.g. `{"loss": 0.41}` each step, `{"val acc": 0.9}` after validation.

        With `throttle` (the per-step loss), the line hears of it at most every
        `SHOW_INTERVAL_S`, as often as the bar redraws: the values are kept, and the
        next send carries the latest.
        """
        if _reporter is None:
            return
        self._values.update(values)
        now = time.monotonic()
        if throttle and now - self._shown_at < SHOW_INTERVAL_S:
            return
        self._shown_at = now
        report_progress(
            "metrics",
            format_values(self._values),
            self._total,
            self._epoch,
            self._max_epochs,
        )

    def epoch_summary(self, row: dict[str, object], max_epochs: int) -> None:
        """Send the summary line of a trained epoch, from its history row."""
        if _reporter is not None:
            text = epoch_summary(row, max_epochs)
            report_progress("epoch", text, 0, self._epoch, max_epochs)

    def phase(self, label: str = "") -> None:
        """The stretch is doing `label` ("compiling gradient"); "" resumes its units.

        Clears the note.
        """
        _clear_notes()
        report_progress("phase", label, self._total, self._epoch, self._max_epochs)

    def done(self, text: str = "") -> None:
        """The entry point's last stretch is over; `text` closes the line.

        "" closes with the default (`done: 40/40 epochs`, `setup done`). Sent once,
        and only by the outermost driver.
        """
        if self._closed:
            return
        self.end()
        self._closed = True
        if not self._nested:
            report_progress("done", text, 0, self._epoch, self._max_epochs)


def _name(f: object) -> str:
    return getattr(f, "__qualname__", None) or type(f).__name__
