"""How a checkpointer names a record: the name function's answer checked, and a free
variant of it when the name belongs to another run.

The name function is the checkpointer's `name`, else the experiment's
`checkpoint_filename` hook bound at setup, else the default record name
(`jaxnitro.checkpoint_filename`). Its answer must be a bare filename without a NUL
byte; the record suffix is appended when it is missing. A name that would overwrite
a file this run does not own gets `-run-<id>` (then `-run-<id>-2`, ...) before the
extension.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import CheckpointError, ConfigError
from ..experiment.record_name import RECORD_SUFFIX, checkpoint_filename
from .manifest import ManifestEntry
from .record import read_header


def name_function(
    name: Callable[..., str] | None, bound: Callable[..., str] | None
) -> tuple[Callable[..., str], str]:
    """The function that names records, and what an error calls it: `name` (the
    "name function"), else the bound hook, else the default record name."""
    if name is not None:
        return name, "name function"
    return (bound or checkpoint_filename), "checkpoint_filename"


def record_filename(
    function: Callable[..., str],
    who: str,
    *,
    epoch: int,
    step: int,
    metric: str | None,
    score: float | None,
) -> str:
    """`function`'s name for a record, checked, with the record suffix.

    Raises:
        ConfigError: the name holds a NUL byte, or is not a bare filename.
    """
    name: Any = function(epoch=epoch, step=step, metric=metric, score=score)
    if isinstance(name, str) and "\x00" in name:
        raise ConfigError(
            f"The checkpointer's {who} returned {name!r}, which holds a NUL byte "
            f"(\\x00); no file name can hold one. Return a filename without it, "
            f"such as 'epoch-0003.safetensors'."
        )
    if not isinstance(name, str) or not name or os.path.basename(name) != name:
        raise ConfigError(
            f"The checkpointer's {who} returned {name!r}; it must return "
            f"a filename without a directory, such as 'epoch-0003.safetensors'."
        )
    return name if name.endswith(RECORD_SUFFIX) else name + RECORD_SUFFIX


def check_name_function(
    function: Callable[..., str], who: str, *, metric: str | None
) -> None:
    """Call the name function once with sample values, so a broken one fails at
    setup rather than after the first epoch.

    Raises:
        ConfigError: the function raised, or its answer is no bare filename.
    """
    score = None if metric is None else 0.5
    sample: dict[str, Any] = {"epoch": 1, "step": 1, "metric": metric, "score": score}
    try:
        record_filename(function, who, epoch=1, step=1, metric=metric, score=score)
    except ConfigError:
        raise
    except Exception as error:
        spelled = ", ".join(f"{k}={v!r}" for k, v in sample.items())
        raise ConfigError(
            f"The checkpointer's {who} failed on sample values ({spelled}): "
            f"{type(error).__name__}: {error}. It is called with the keywords "
            f"epoch, step, metric and score; accept **names for any added later."
        ) from error


def free_filename(
    directory: str,
    entries: Sequence[ManifestEntry],
    replaced: Sequence[ManifestEntry],
    filename: str,
    *,
    run: str | None,
) -> str:
    """`filename`, or it with `-run-<id>` when that would overwrite another's.

    Raises:
        CheckpointError: every variant up to `-run-<id>-99` belongs to another run.
    """
    mine = {e.file for e in replaced}
    listed = {e.file for e in entries} - mine
    stem = filename[: -len(RECORD_SUFFIX)]
    candidates = [filename, f"{stem}-run-{run}{RECORD_SUFFIX}"]
    candidates += [f"{stem}-run-{run}-{i}{RECORD_SUFFIX}" for i in range(2, 100)]
    for name in candidates:
        if name in listed:
            continue
        path = os.path.join(directory, name)
        if name in mine or not os.path.exists(path) or is_own_orphan(path, run):
            return name
    raise CheckpointError(
        f"Cannot find a free checkpoint filename for {filename} in {directory}: "
        f"every variant up to -run-{run}-99 belongs to another run."
    )


def is_own_orphan(path: str, run: str | None) -> bool:
    """A record run `run` renamed into place but never listed (a killed write)."""
    try:
        header = read_header(path)
    except CheckpointError:
        return False
    # An average_checkpoints file has run None, so it can pass for an orphan
    # only of a run with no id; a record of a run that started from an average
    # also carries averaged_from, and is its run's own.
    return header.run == run and (run is not None or header.averaged_from is None)
