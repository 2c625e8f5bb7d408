"""`load_checkpoint`: a record read through the checkpointer that wrote it."""

from __future__ import annotations

import os
from typing import Any

from ..errors import ConfigError
from .record import CheckpointRecord


def load_checkpoint(
    checkpointer: Any, path: str | os.PathLike[str]
) -> CheckpointRecord | None:
    """Load the record at `path` through the checkpointer that wrote it.

    It asks the checkpointer (`checkpointer.load(path)`) rather than reading the
    file itself, so a checkpointer with another storage backend can implement it;
    `Checkpointer.load` reads the file, refusing a damaged or foreign one and a
    record of another format version by name.

    Args:
        checkpointer: a `Checkpointer`, any object with a `load(path)` method, or
            None.
        path: the record's path.

    Returns:
        CheckpointRecord | None: the record (`.header`, a `RecordHeader`;
        `.arrays`, the stored arrays by key), or None when `checkpointer` is None.

    Raises:
        CheckpointError: the file is missing, damaged or not a record.
        ConfigError: `checkpointer` has no `load` method.

    Example::

        path = "runs/exp/epoch-0003-step-12.safetensors"
        record = nx.load_checkpoint(nitro.checkpointer, path)
        record.header.epoch, sorted(record.arrays)[:2]
    """
    if checkpointer is None:
        return None
    load = getattr(checkpointer, "load", None)
    if not callable(load):
        raise ConfigError(
            f"load_checkpoint: {type(checkpointer).__name__} has no load(path) "
            f"method; pass a Checkpointer, an object with load(path), or None."
        )
    return load(path)  # type: ignore[no-any-return]
