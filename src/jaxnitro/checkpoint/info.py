"""`checkpoint_info`: a record's metadata, read from the header without its weights."""

from __future__ import annotations

import os
from typing import Any

from .record import read_header

INFO_KEYS = (
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
    "anchor_checksum",
    "metrics",
    "run",
    "experiment",
    "averaged_from",
)

# The header field an info key reads, where the names differ.
_FIELD_OF = {"anchor_checksum": "anchor_checksums"}


def checkpoint_info(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a checkpoint's metadata (epoch, step, seed, preset, metrics, ...).

    Only the safetensors header is read: no weight is loaded. `run_id` and `run_url`
    are the logger's; `run` is the checkpoint run id the manifest lists it under.
    `anchor_checksum` holds the anchor checksums of the Decay anchors, and
    `averaged_from` is present for a record `average_checkpoints` wrote and for the
    records of a run that started from `weights=(run, Average(sel))`.
    A damaged or foreign file raises `CheckpointError` naming it.
    """
    header = read_header(os.fspath(path))
    info = {
        key: getattr(header, _FIELD_OF.get(key, key))
        for key in INFO_KEYS
        if key != "averaged_from"
    }
    if header.averaged_from is not None:
        info["averaged_from"] = header.averaged_from
    return info
