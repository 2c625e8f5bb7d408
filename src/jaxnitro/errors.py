"""The exception and warning classes jaxnitro raises.

Every error the framework raises derives from `NitroError`, so a driver can catch the
framework's refusals without catching unrelated bugs. Subclasses exist where a caller
would reasonably catch one kind separately.
"""

from __future__ import annotations

import os
import sys


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
