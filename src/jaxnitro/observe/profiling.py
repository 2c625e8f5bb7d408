"""`StepProfiler`: a `jax.profiler` trace of chosen optimizer steps of a run.

The run keyword `profile=(first_step, n_steps)` traces optimizer steps `first_step`
to `first_step + n_steps - 1` (1-based, counted over the whole run, as the logger
counts them) into `<run_dir>/profile/`. The directory is what TensorBoard's profile
plugin reads (`tensorboard --logdir <run_dir>/profile`), and each trace also comes
as a Perfetto file (`*.trace.json.gz`, open it at ui.perfetto.dev).

The loop calls `at_step` before it dispatches each optimizer step. The trace starts
before step `first_step` is dispatched and stops once the last traced step has run
on the device (the loop's state is waited for), so the trace holds the steps' device
work, not only their dispatch. Steps a resumed run has already trained are not
traced again; a run that ends before the last traced step stops the trace at its end.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import jax

from ..errors import ConfigError, NitroWarning

PROFILE_DIRNAME = "profile"


def check_profile(value: Any) -> tuple[int, int] | None:
    """`profile=`: None, or `(first_step, n_steps)`, two whole numbers >= 1."""
    if value is None:
        return None
    if (
        isinstance(value, tuple | list)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        and value[0] >= 1
        and value[1] >= 1
    ):
        return (int(value[0]), int(value[1]))
    raise ConfigError(
        f"profile must be (first_step, n_steps), two whole numbers >= 1 such as "
        f"profile=(10, 5) to trace optimizer steps 10 to 14; got {value!r}. Leave "
        f"it None to profile nothing."
    )


class StepProfiler:
    """Traces optimizer steps `first` to `first + count - 1` into `directory`.

    Args:
        first: the first traced optimizer step (1-based, over the whole run).
        count: how many steps to trace.
        directory: where the trace goes (the run keyword uses
            `<run_dir>/profile`).

    Attributes:
        traced: whether a trace was written (started and stopped).
    """

    def __init__(self, first: int, count: int, directory: str) -> None:
        self.first = first
        self.count = count
        self.directory = directory
        self.traced = False
        self._active = False

    def at_step(self, completed: int, wait_for: Any) -> None:
        """Before an optimizer step is dispatched; `completed`: the steps before it.

        `wait_for`: the state the last traced step produced, waited for before the
        trace stops.
        """
        if self._active:
            if completed >= self.first - 1 + self.count:
                self.stop(wait_for)
        elif not self.traced and completed == self.first - 1:
            self._start()

    def stop(self, wait_for: Any) -> None:
        """End the trace, once the device has run what it traced (no-op if none)."""
        if not self._active:
            return
        self._active = False
        try:
            jax.block_until_ready(wait_for)
        finally:
            jax.profiler.stop_trace()
            self.traced = True

    def _start(self) -> None:
        os.makedirs(self.directory, exist_ok=True)
        try:
            jax.profiler.start_trace(self.directory, create_perfetto_trace=True)
        except RuntimeError as error:  # another trace is running in this process
            self.traced = True  # do not try again at every step
            warnings.warn(
                f"profile: could not start a trace of steps {self.first} to "
                f"{self.first + self.count - 1} into {self.directory!r}: {error}. Stop "
                f"the other jax.profiler trace first; the run goes on unprofiled.",
                NitroWarning,
                stacklevel=2,
            )
            return
        self._active = True
