"""The setup-time probe that the run's output directories can be written.

A run directory on a read-only mount, without write permission, or on a full disk
would otherwise fail at the first checkpoint, after an epoch of training. At setup
each directory the handle will write into (the checkpointer's, when it trains; a
file logger's) is created as the run would create it, and a small temporary file is
written and removed there. A handle that writes nothing there (built to evaluate or
predict from `resume=` or `weights=`, with `logger=None` or a logger pointed
elsewhere) probes nothing, so it works from a read-only directory.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

from ..checkpoint.checkpointer import Checkpointer
from ..checkpoint.record import TMP_PREFIX
from ..devices.distributed import is_rank0
from ..errors import ConfigError
from ..logging.jsonl import JSONLogger
from ..logging.tensorboard import TensorBoardLogger

NOT_WRITABLE = """\
{directory} cannot be written ({error}), and {writer} writes there: setup wrote a \
small test file to find out now rather than after an epoch of training. Pass a \
run_dir this process can write (or free space there); for a handle that only \
evaluates or predicts from it, pass logger=None (or a logger pointed elsewhere) and \
train nothing, which writes nothing there."""


def probe_writable(directory: str, writer: str) -> None:
    """Create `directory` (as the run would) and write and remove a small file in
    it; `ConfigError` naming the directory, the OS error, `writer` (what writes
    there) and the fix if that fails.

    Examples:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     probe_writable(tmp, "the checkpointer")
        ...     os.listdir(tmp)
        []
    """
    try:
        os.makedirs(directory, exist_ok=True)
        # A temporary name (never a record's), removed at once.
        handle, path = tempfile.mkstemp(prefix=f"{TMP_PREFIX}probe-", dir=directory)
        try:
            os.write(handle, b"jaxnitro write probe\n")
        finally:
            os.close(handle)
            os.remove(path)
    except OSError as error:
        raise ConfigError(
            NOT_WRITABLE.format(
                directory=directory,
                error=_describe(error),
                writer=writer,
            )
        ) from error


def probe_outputs(
    checkpointer: Checkpointer | None, logger: Any, *, trains: bool, loads: bool
) -> str | None:
    """Probe the directories this handle will write into; call it after the
    checkpointer and the logger are bound to the run directory.

    A file logger's directory (a JSON-lines file's folder, a TensorBoard log
    directory) must be writable now: the logger writes the run's parameters at
    construction. The checkpointer's is probed when the handle has a train split
    (only train() saves). A handle that `loads` weights (`resume=`, `weights=`)
    may be built only to evaluate or predict, so a checkpointer directory it
    cannot write is returned as the refusal `train()` raises before any work;
    any other handle is refused now.

    Raises:
        ConfigError: a directory cannot be written, naming it, the OS error and
            the fix.
    """
    if not is_rank0():
        return None  # in a run across processes, rank 0 alone writes
    logger_dir = _logger_directory(logger)
    if logger_dir is not None:
        probe_writable(logger_dir, f"the {type(logger).__name__}")
    if not trains or checkpointer is None or checkpointer.dir is None:
        return None
    try:
        probe_writable(os.path.abspath(checkpointer.dir), "the checkpointer")
    except ConfigError as refusal:
        if not loads:
            raise
        return str(refusal)
    return None


def _logger_directory(logger: Any) -> str | None:
    """The local directory a file logger writes in; None for any other logger."""
    if isinstance(logger, JSONLogger) and logger.path is not None:
        return os.path.dirname(os.path.abspath(logger.path))
    if isinstance(logger, TensorBoardLogger) and logger.logdir is not None:
        return str(logger.logdir)
    return None


def _describe(error: OSError) -> str:
    """`[Errno 30] Read-only file system` without the temporary file's name."""
    if error.errno is not None and error.strerror:
        return f"[Errno {error.errno}] {error.strerror}"
    return str(error)
