"""`RunPhase`: a run's phase and its progress line, the door every part of a run
announces through.

The handle's `PhaseRecorder` (`observe/transitions.py`) records the phase and
publishes it to the monitors; this adds what a run does around it: the first
Terminal phase (Done, Failed) releases the data sources, after the monitors ran, and
the progress line of the entry point running now is found here. The programs' memo
(`compile.executables.PhaseOwner`), an evaluation pass (`loop.context.EvalHost`,
through `run/evaluation.py`), a checkpoint write and the training run announce
their phases through it; `Nitro.phase` reads it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ..observe import phases
from ..observe.progress import Progress
from ..observe.transitions import PhaseRecorder


class RunPhase:
    """The phase of one run and the progress line its entry point shows.

    Args:
        recorder: the handle's recorder (its monitors).
        on_terminal: called once the first Terminal phase was published, with
            what ended the run (it releases the data sources).
    """

    def __init__(
        self, recorder: PhaseRecorder, on_terminal: Callable[[str], None]
    ) -> None:
        self._recorder = recorder
        self._on_terminal = on_terminal
        self._progress: Progress | None = None

    @property
    def phase(self) -> phases.Phase:
        """The latest recorded phase (`Starting()` until the first)."""
        return self._recorder.phase

    def set_phase(self, phase: phases.Phase, **info: Any) -> None:
        """Record `phase` and publish it to the monitors (a repeat is a no-op).

        The first Terminal phase releases the data sources, after the monitors ran.
        """
        if self._recorder.set(phase, **info) and isinstance(phase, phases.Terminal):
            self._on_terminal(f"the end of train() (phase {type(phase).__name__})")

    def enter(self, phase: phases.Phase, **info: Any) -> None:
        """Record and publish `phase` even when it is the current one (the start of
        each training epoch, `info.epoch_started`)."""
        self._recorder.enter(phase, **info)

    def restore_phase(self, phase: phases.Phase, **info: Any) -> None:
        """Go back to `phase`, the one before a compile or an evaluation that failed
        or ended, without publishing it (`PhaseRecorder.restore`)."""
        self._recorder.restore(phase, **info)

    def progress(self) -> Progress | None:
        """The progress line of the entry point running now, if any."""
        return self._progress

    @contextmanager
    def showing(self, bar: Progress | None) -> Iterator[Progress | None]:
        """Show `bar` while the block runs; yields the line it covers (None for an
        outermost entry point)."""
        outer, self._progress = self._progress, bar
        try:
            yield outer
        finally:
            self._progress = outer
