"""Smoke runs: every part of a run exercised in seconds, the real run untouched.

`Nitro(e, smoke=True)`, or any run built while the environment variable
`NITRO_SMOKE=1` is set, trains one epoch on the first two batches of the train split
(`max(2, accum)`, a whole optimizer step), validates on the first two batches of
each evaluation split, writes one checkpoint and a JSON-lines log into a new
temporary directory, and prints what it exercised when `train()` ends. Lightning
calls this `fast_dev_run`.

What the smoke run changes, each shown with the source "smoke" in the binding
report: `max_epochs` is 1; `run_dir` is a new `nitro-smoke-*` temporary directory,
removed when the handle is garbage collected or the process exits, whichever comes
first (so smoke runs leave nothing in the temporary directory);
the logger is a `JSONLogger` there (the experiment's logger is never constructed,
since a tracking logger may open a remote run; `logger=None` keeps logging off);
the checkpointer keeps the last record there (`checkpointer=None` keeps it off).
Everything else (the model, the data pipeline with its prefetch, the compiled
programs, the optimizer, schedules over the shortened run) is the real run's.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TextIO

from ..errors import ConfigError
from ..observe.number_format import format_number
from .accessors import Source

if TYPE_CHECKING:
    from .handle import Nitro

SMOKE_ENV = "NITRO_SMOKE"
SMOKE_BATCHES = 2
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")
_ROW_AXES = ("epoch", "step", "train_loss", "seconds")  # a history row's own columns


def smoke_requested(keywords: Mapping[str, Any]) -> tuple[bool, Source]:
    """Whether this run is a smoke run, and where that came from.

    The `smoke` keyword wins; without it, the `NITRO_SMOKE` environment variable.

    Raises:
        ConfigError: a `smoke` keyword that is not a bool, or a `NITRO_SMOKE` value
            that is neither true ("1", "true", "yes", "on") nor false ("0",
            "false", "no", "off", empty).
    """
    if "smoke" in keywords and keywords["smoke"] is not None:
        value = keywords["smoke"]
        if not isinstance(value, bool):
            raise ConfigError(
                f"smoke must be True or False, got {value!r}. smoke=True runs one "
                f"epoch on two batches of every split in a temporary directory."
            )
        return value, "keyword"
    text = os.environ.get(SMOKE_ENV, "").strip().lower()
    if text in _TRUE:
        return True, "environment"
    if text in _FALSE:
        return False, "default"
    raise ConfigError(
        f"{SMOKE_ENV}={os.environ[SMOKE_ENV]!r}: set it to 1 for a smoke run, or to "
        f"0 (or leave it unset) for a full one."
    )


_made: set[str] = set()
_made_lock = threading.Lock()


def smoke_run_dir() -> str:
    """A new temporary run directory for a smoke run, removed at the latest when
    the process exits (`remove_smoke_run_dir`)."""
    path = tempfile.mkdtemp(prefix="nitro-smoke-")
    with _made_lock:
        if not _made:
            atexit.register(_remove_all)
        _made.add(path)
    return path


def remove_smoke_run_dir(lock: Any, path: str) -> None:
    """Remove a smoke run's directory once its handle is gone: the handle's share
    of the directory's lock (`RunLockShare`) is released first."""
    lock.release()
    with _made_lock:
        _made.discard(path)
    shutil.rmtree(path, ignore_errors=True)


def _remove_all() -> None:
    """At exit: the smoke directories no handle removed (a setup that failed)."""
    with _made_lock:
        left = list(_made)
        _made.clear()
    for path in left:
        shutil.rmtree(path, ignore_errors=True)


def smoke_logger() -> Any:
    """The smoke run's logger: JSON lines in its run directory."""
    from ..logging.jsonl import JSONLogger

    return JSONLogger()


def smoke_checkpointer() -> Any:
    """The smoke run's checkpointer: the last record, in its run directory."""
    from ..checkpoint.checkpointer import Checkpointer
    from ..checkpoint.selectors import Last

    return Checkpointer(keep=Last(1))


def smoke_batches(split: str, accum: int) -> int:
    """How many batches of `split` a smoke run reads."""
    return max(SMOKE_BATCHES, accum) if split == "train" else SMOKE_BATCHES


def smoke_report(nitro: Nitro, full_sizes: Mapping[str, int]) -> str:
    """What a smoke run exercised, one line per part."""
    lines = [
        f"smoke run: 1 epoch in {nitro.run_dir} (a temporary directory, removed "
        f"with this handle or at exit)"
    ]
    history = nitro.history[-1] if nitro.history else {}
    for name, split in nitro.data.items():
        read = f"{len(split)} of {full_sizes.get(name, len(split))} batches"
        if name == "train":
            loss = history.get("train_loss")
            shown = "" if loss is None else f", train loss {format_number(loss)}"
            lines.append(
                f"  train: {read}, {nitro.current_step} optimizer steps{shown}"
            )
        elif name == "val":
            metrics = {
                k: v
                for k, v in history.items()
                if k not in _ROW_AXES and isinstance(v, int | float)
            }
            shown = ", ".join(f"{k} {format_number(v)}" for k, v in metrics.items())
            lines.append(f"  val: {read}, validated" + (f": {shown}" if shown else ""))
        else:
            lines.append(f"  {name}: {read} (evaluate() reads them)")
    ckpt = nitro.checkpointer
    if ckpt is not None and ckpt.dir is not None:
        written = sorted(f for f in os.listdir(ckpt.dir) if f.endswith(".safetensors"))
        lines.append(
            f"  checkpoint: {os.path.join(ckpt.dir, written[-1])}"
            if written
            else "  checkpoint: none written"
        )
    path = getattr(nitro.logger, "path", None)
    if path is not None:
        lines.append(f"  log: {path}")
    programs = [kind for kind, _ in nitro.executables.compiled()]
    lines.append(f"  compiled: {', '.join(programs) or 'nothing'}")
    return "\n".join(lines)


def print_smoke_report(
    nitro: Nitro, full_sizes: Mapping[str, int], file: TextIO | None = None
) -> None:
    """Print `smoke_report` to stderr (or `file`)."""
    print(smoke_report(nitro, full_sizes), file=sys.stderr if file is None else file)
