"""Paths and names a checkpoint reader or writer is given, checked before any OS call.

The OS takes no NUL byte in a path, and Python raises a bare `ValueError: embedded
null byte` at the first call that passes one on. `checked_path` refuses it first as a
`CheckpointError` naming the path and where the byte sits.

    >>> checked_path("runs/a\\x00b.safetensors", "a checkpoint path")
    Traceback (most recent call last):
    ...
    jaxnitro.errors.CheckpointError: a checkpoint path '...' holds a NUL byte ...
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import CheckpointError

NUL_IN_PATH = (
    "{what} {path!r} holds a NUL byte (\\x00) at position {at}; no file name can "
    "hold one. Pass the name without it (text read from a file, a socket or a "
    "terminal may carry one)."
)


def checked_path(path: Any, what: str) -> Any:
    """`path` as given, refused when its text holds a NUL byte.

    Args:
        path: a str, bytes or os.PathLike path (anything else is returned as is,
            for the caller's own type check).
        what: what the path is, for the message ("a checkpoint path").

    Raises:
        CheckpointError: the path holds a NUL byte.
    """
    text = os.fspath(path) if isinstance(path, os.PathLike) else path
    at = -1
    if isinstance(text, str):
        at = text.find("\x00")
    elif isinstance(text, bytes):
        at = text.find(b"\x00")
    if at >= 0:
        raise CheckpointError(NUL_IN_PATH.format(what=what, path=text, at=at))
    return path
