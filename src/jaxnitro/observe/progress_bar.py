"""The terminal progress reporter: one rich bar per entry point, on one line.

The bar reads `epoch 3/40: train [compiling gradient]`, filled by the run's fraction
with the run's ETA, and ends as `done: 40/40 epochs` with the elapsed time. Setup
reads `setup [building data]` over a pulsing bar, and ends as `setup done`. Each
epoch's summary line (`epoch 3/40: train_loss 0.4123 · val acc 0.9031 · 2.1 s`) is
printed above the live bar and stays on screen, as Keras's `verbose=1` keeps it:

    setup done                           ━━━━━━━━━━━━━━━━━━━━━━━ 100% 0:00:01
    epoch 1/3: train_loss 0.6931 · val acc 0.81 · 1.2 s
    epoch 2/3: train_loss 0.4123 · val acc 0.9031 · 0.9 s
    epoch 3/3: train · loss 0.3517 · val acc 0.9031 ━━━━━━━━━━━━━━━━━━━╸━━━  83% 0:00:01

Events only change a `ProgressLine` (a few attribute writes, cheap enough per step or
per note); rich's refresh thread reads it when it redraws, at most ten times a second.
So a burst of notes costs no redraws, and the display is never more than a tenth of a
second behind. While the bar is live, rich shows what the program prints above it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import Any

from rich.console import Console, RenderableType
from rich.progress import (
    BarColumn,
    Progress,
    TaskID,
    TaskProgressColumn,
    TextColumn,
    TimeRemainingColumn,
)
from rich.table import Column

from .progress_line import ProgressLine

REFRESH_PER_SECOND = 10.0
"""The bar redraws at most this often."""


def is_terminal_session() -> bool:
    """Whether a person watches stderr: it is a terminal, and TERM is not "dumb".

    This is what "interactive" means here: a script run from a terminal gets the bar,
    as a REPL does; CI logs, pipes, files and test capture (whose stderr is no
    terminal) do not.
    """
    stream = sys.stderr
    if stream is None:
        return False
    try:
        tty = bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False
    return tty and os.environ.get("TERM", "") != "dumb"


class _LineProgress(Progress):
    """A rich Progress that copies the line into its one task before each redraw."""

    def __init__(self, owner: BarReporter, *args: Any, **kwargs: Any) -> None:
        self._owner = owner  # before super(): rich renders once while constructing
        super().__init__(*args, **kwargs)

    def get_renderables(self) -> Iterable[RenderableType]:
        self._owner._sync()
        yield from super().get_renderables()


class BarReporter:
    """A progress reporter drawing one rich bar per entry point.

    Args:
        console: where to draw. The default, stderr, draws only when
            `is_terminal_session()`; a console passed here is always drawn to (tests,
            recordings).
        refresh_per_second: the redraw rate.

    Examples:
        >>> import io
        >>> from rich.console import Console
        >>> out = io.StringIO()
        >>> bar = BarReporter(console=Console(file=out, width=80, force_terminal=False))
        >>> bar("begin", "train", 2, 1, 1)
        >>> bar("step", "", 0, 0, 0); bar("step", "", 0, 0, 0); bar("end", "", 0, 0, 0)
        >>> bar("done", "", 0, 0, 0)
        >>> "done: 1/1 epochs" in out.getvalue()
        True
    """

    def __init__(
        self,
        *,
        console: Console | None = None,
        refresh_per_second: float = REFRESH_PER_SECOND,
    ) -> None:
        self._console = console
        self._refresh = refresh_per_second
        self._line = ProgressLine()
        self._progress: _LineProgress | None = None
        self._task: TaskID | None = None
        self._closing: str | None = None

    @property
    def line(self) -> ProgressLine:
        """The line being drawn (a fresh one between entry points)."""
        return self._line

    @property
    def is_live(self) -> bool:
        """Whether a bar is on screen now."""
        return self._progress is not None

    def print_above(self, renderable: RenderableType) -> bool:
        """Print above the live bar, which redraws below it; False when none is live.

        Output written past a live bar on another console would land on the bar's
        line and leave a torn copy of it on screen.
        """
        progress = self._progress
        if progress is None:
            return False
        progress.console.print(renderable)
        return True

    def __call__(
        self, verb: str, label: str, total: int, epoch: int, max_epochs: int
    ) -> None:
        if verb == "begin":
            if self._progress is None and not self._start():
                return
            self._line.begin(label, total, epoch, max_epochs)
            return
        if self._progress is None:
            return
        if verb == "step":
            self._line.step()
        elif verb == "phase":
            self._line.set_phase(label)
        elif verb == "note":
            self._line.note = label
        elif verb == "metrics":
            self._line.values = label
        elif verb == "epoch":  # the epoch's summary line stays, above the bar
            self._progress.console.print(label, markup=False, highlight=False)
        elif verb == "done":
            self._finish(label)
        # "end" changes nothing on the line; unknown verbs are ignored

    def advance(self, count: int) -> None:
        """`count` "step" events at once."""
        if self._progress is not None:
            self._line.step(count)

    def _start(self) -> bool:
        console = self._console
        if console is None:
            if not is_terminal_session():
                return False
            console = Console(stderr=True)
        progress = _LineProgress(
            self,
            TextColumn(
                "{task.description}",
                markup=False,  # "[compiling gradient]" is text, not a rich style
                table_column=Column(no_wrap=True, overflow="ellipsis"),
            ),
            BarColumn(bar_width=30),
            TaskProgressColumn(),
            TimeRemainingColumn(elapsed_when_finished=True),
            console=console,
            refresh_per_second=self._refresh,
            transient=False,
        )
        self._line = ProgressLine()
        self._task = progress.add_task("", total=None)
        self._progress = progress
        progress.start()
        return True

    def _sync(self) -> None:
        progress, task = self._progress, self._task
        if progress is None or task is None:
            return
        line = self._line
        fraction = line.fraction
        text = self._closing or line.description()
        if fraction is None:
            progress.update(task, description=text, total=None)
        else:
            progress.update(task, description=text, total=1.0, completed=fraction)

    def _finish(self, text: str) -> None:
        progress, task = self._progress, self._task
        assert progress is not None and task is not None
        if self._line.fraction is None:  # a stretch of unknown length ends full
            self._line.total = self._line.done = 1
        # From here every redraw, the refresh thread's too, shows the closing text.
        self._closing = self._line.closing(text)
        self._sync()
        progress.stop()  # the final redraw, then a newline: the line stays
        self._progress = self._task = self._closing = None
        self._line = ProgressLine()
