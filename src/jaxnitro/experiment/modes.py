"""Train and eval mode at trace time: `jaxnitro.training()`.

A hook reads the mode as a plain Python bool while it is traced, so a model can branch
on it at trace time, e.g. `model.apply(..., deterministic=not jaxnitro.training())`.
The gradient program is traced in train mode; every evaluation program in eval mode.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

_TRAINING = contextvars.ContextVar("jaxnitro_training", default=False)


def training() -> bool:
    """Whether the hook being traced runs in train mode (a Python bool).

    Examples:
        >>> training()
        False
        >>> with training_mode(True):
        ...     training()
        True
    """
    return _TRAINING.get()


@contextlib.contextmanager
def training_mode(flag: bool) -> Iterator[None]:
    """Set the trace-time mode for the duration of a trace."""
    token = _TRAINING.set(flag)
    try:
        yield
    finally:
        _TRAINING.reset(token)
