"""The exception and warning classes jaxnitro raises.

Every error the framework raises derives from `NitroError`, so a driver can catch the
framework's refusals without catching unrelated bugs. Subclasses exist where a caller
would reasonably catch one kind separately.
"""

from __future__ import annotations

import os
import sys

__all__ = [
    "CheckpointError",
    "ConfigError",
    "DistributedError",
    "DivergenceError",
    "HookError",
    "MissingExtraError",
    "NitroError",
    "NitroWarning",
    "NotYetSupportedError",
    "Preempted",
    "RoutingError",
    "RunDirLockedError",
    "StaleHandleWarning",
    "StrippedHostError",
]


class NitroError(Exception):
    """Base of every error jaxnitro raises."""


class ConfigError(NitroError, ValueError):
    """A configuration value is refused: a field, a run keyword, a preset key."""


class HookError(NitroError, TypeError):
    """An experiment hook is missing, or was called with or returned the wrong thing."""


class RoutingError(HookError):
    """A batch field a hook declares is missing, or a batch is not a mapping."""


class StrippedHostError(NitroError):
    """Traced code used a Host field, which the tracer only sees as a sentinel.

    Not a `TypeError`: JAX catches the TypeErrors raised while it reads a jitted
    function's arguments (`jnp.sum(x)` is one) and replaces them with its own message,
    which names neither the field nor the fixes.
    """


class DivergenceError(NitroError, FloatingPointError):
    """The training loss became NaN or infinite."""


class CheckpointError(NitroError):
    """A checkpoint cannot be found, read, or matched to this experiment."""


class RunDirLockedError(CheckpointError):
    """Another process holds the run directory's lock: it is writing that directory.

    Attributes:
        directory: the locked run directory.
        pid: the holder's process id, or None when its lock file names none.
        host: the holder's hostname, or None when its lock file names none.
    """

    def __init__(
        self, message: str, *, directory: str, pid: int | None, host: str | None
    ) -> None:
        super().__init__(message)
        self.directory = directory
        self.pid = pid
        self.host = host


class Preempted(SystemExit):
    """A SIGTERM stopped the run gracefully; raising this ends the process.

    Cluster schedulers send SIGTERM before they preempt a job. An entry point that
    received one (`train`, `validate`, ...) stops at the next step boundary, then
    validates, checkpoints and finishes the logger exactly as for Ctrl+C, and then
    raises `Preempted`, so the process exits with status 143 (128 + SIGTERM, what
    the scheduler expects of a process its SIGTERM ended) after its `finally`
    blocks ran, and without a traceback. It derives from `SystemExit`, not from
    `NitroError`: an `except Exception` in a training script does not swallow the
    preemption. Catch `Preempted` itself to do something else first (requeue the
    job, upload the checkpoint), then re-raise it.

    Attributes:
        code: the exit status, 143.
        stop_reason: how the interrupted call ended ("preempted" for a `train()`
            that stopped for it).
    """

    EXIT_STATUS = 143

    def __init__(self, message: str, *, stop_reason: str | None = None) -> None:
        super().__init__(message)
        self.code = self.EXIT_STATUS  # what the interpreter exits with, silently
        self.stop_reason = stop_reason


class DistributedError(NitroError, RuntimeError):
    """The processes of a multi-process run cannot join or keep up with each other:
    a coordinator that never answers, a port already taken, processes that feed
    different amounts of data."""


class NotYetSupportedError(NitroError, NotImplementedError):
    """A spec feature whose implementation has not landed yet.

    Raised instead of silently ignoring a keyword or an accessor override, so a run
    never trains with a setting it did not honour.
    """


class NitroWarning(UserWarning):
    """Base of every warning jaxnitro emits."""


class StaleHandleWarning(NitroWarning):
    """A hook or accessor was redefined after a `Nitro` froze it."""


class MissingExtraError(NitroError, ImportError):
    """An optional feature needs a package its extra installs, and it is missing."""


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def user_stacklevel() -> int:
    """The `stacklevel` for a warning raised here that names the first caller
    outside jaxnitro (the user's `Nitro(...)` line), however deep in the package
    the warning is raised: `warnings.warn(text, Cls, stacklevel=user_stacklevel())`.
    """
    frame = sys._getframe(1)  # the function about to warn: stacklevel 1
    level = 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(
        _PACKAGE_DIR
    ):
        frame = frame.f_back
        level += 1
    return level
