"""`checkpoint_info`: a record's metadata, read from the header without its weights;
`checkpoint_path`: the record a `(run, which)` pair names in a run directory."""

from __future__ import annotations

import os
from typing import Any

from ..errors import CheckpointError
from .lookup import resolve_checkpoint
from .record import read_header

WHICH_VALUES = ("latest", "best")

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


def checkpoint_path(run_dir: str | os.PathLike[str], run: str, which: str) -> str:
    """The record `(run, which)` names in `run_dir`, as `weights=(run, which)`
    would read it: `run` a run id, "latest" (the newest run) or "all"; `which`
    "latest" or "best" (by the metric the newest scored entry was written under).

    Raises:
        CheckpointError: `which` is neither, or the directory holds no such record
            (the message lists the runs it holds).
    """
    if which not in WHICH_VALUES:
        raise CheckpointError(
            f"({run!r}, {which!r}): which is {' or '.join(map(repr, WHICH_VALUES))}, "
            f'not {which!r}; e.g. ({run!r}, "best").'
        )
    found = resolve_checkpoint(None, os.fspath(run_dir), run, which, what="ckpt")
    return found.path
