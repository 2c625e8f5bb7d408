"""`checkpoint_info`: a record's metadata, read from the header without its weights."""

from __future__ import annotations

import os
from typing import Any

from .record import read_meta


def checkpoint_info(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a checkpoint's metadata (epoch, step, seed, preset, metrics, ...).

    Only the safetensors header is read: no weight is loaded.
    """
    meta = read_meta(os.fspath(path))
    keys = (
        "format_version",
        "framework_version",
        "epoch",
        "step",
        "seed",
        "preset",
        "run_id",
        "run_url",
        "logger_type",
        "stop_reason",
        "metrics",
        "run",
        "experiment",
    )
    return {key: meta.get(key) for key in keys}
