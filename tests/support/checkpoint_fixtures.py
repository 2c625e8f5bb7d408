"""Checkpointers writing small host trees, without training: fast retention tests."""

from __future__ import annotations

import json
import os
import struct

import numpy as np

from jaxnitro.checkpoint.checkpointer import Checkpointer
from jaxnitro.checkpoint.header import RecordHeader
from jaxnitro.checkpoint.manifest import MANIFEST


def params_at(value: float, width: int = 3) -> dict:
    """A parameter tree whose every entry is `value` (so averages are checkable)."""
    return {
        "w": np.full((2, width), value, np.float32),
        "b": np.full((width,), -value, np.float32),
    }


def record_header(**changes) -> RecordHeader:
    """A header with every required key, as a small record written without a run
    would hold; `changes` override fields."""
    fields = dict(
        framework_version="0.0.0",
        experiment="tests.Fixture",
        epoch=0,
        step=0,
        seed=0,
        preset=None,
        graphconst={},
        config={},
        logger_type=None,
        run_id=None,
        run_url=None,
    )
    return RecordHeader(**{**fields, **changes})


def bound(
    directory,
    run: str | None = "r1",
    keep=None,
    metric: str | None = "loss",
    mode: str | None = "min",
    **kw,
) -> Checkpointer:
    """A checkpointer bound to `directory` as setup would bind it."""
    ckpt = Checkpointer(keep=keep, **kw) if keep is not None else Checkpointer(**kw)
    ckpt.bind(
        directory=str(directory),
        monitor=(metric, mode) if metric is not None else None,
        run=run,
        parent=None,
    )
    return ckpt


def write(
    ckpt: Checkpointer,
    epoch: int,
    score: float | None,
    *,
    value: float | None = None,
    stop_reason: str | None = None,
    state: float | None = None,
    extra: dict | None = None,
) -> bool:
    """Save epoch `epoch` with validation score `score` (None: no val split), and
    the `extra` validation metrics beside it."""
    metrics = {} if score is None else {ckpt.metric or "loss": score, **(extra or {})}
    v = float(epoch if value is None else value)
    return ckpt.save(
        epoch=epoch,
        step=epoch * 4,
        metrics=metrics,
        trees={
            "params": params_at(v),
            "state": {"count": np.array(epoch if state is None else state, np.int32)},
            "device": {"scale": np.array(v, np.float32)},
        },
        header=record_header(epoch=epoch, step=epoch * 4),
        stop_reason=stop_reason,
    )


def edit_header(path, edit) -> None:
    """Rewrite the record header of the file at `path` as `edit(header_json)`."""
    with open(path, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(size))
        tensors = f.read()
    meta = json.loads(header["__metadata__"]["jaxnitro"])
    header["__metadata__"]["jaxnitro"] = json.dumps(edit(meta))
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + tensors)


def record_files(directory) -> list[str]:
    return sorted(f for f in os.listdir(directory) if f.endswith(".safetensors"))


def manifest_files(directory) -> list[str]:
    from jaxnitro.checkpoint.manifest import read_manifest

    return sorted(e.file for e in read_manifest(str(directory)))


def write_legacy_manifest(directory, entries: list[dict]) -> None:
    """A manifest from before runs were recorded: no run, metric, mode or written."""
    with open(os.path.join(directory, MANIFEST), "w") as f:
        json.dump({"format": 1, "entries": entries}, f)
