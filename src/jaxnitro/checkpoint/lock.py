"""The run-directory lock: one process at a time writes a run directory.

Two processes training into one directory rewrite its `manifest.json` over each
other, and two `resume="auto"` of one run pick the same record and write the same
checkpoint names. So the process that writes a directory holds an OS lock on
`<dir>/.nitro.lock` (`fcntl.flock`, exclusive, non-blocking). The kernel drops it
when the process ends, however it ends (SIGKILL and a crash included), so a lock is
never stale. The file holds the holder's pid, host and start time, so a refused
second writer is told whose lock it is; the file itself is never deleted (deleting
a lock file lets two processes lock two different files of one name).

The lock is per process, not per handle: every handle of one process that writes a
directory shares that process's lock (a count), so building a second `Nitro` on the
same run directory in a notebook, the first still alive, works. The count falls as
each handle lets go (`RunDirLock.release`), and the last release unlocks.

Reading needs no lock: `weights=`, `evaluate`, `nitro runs` and `nitro ckpt` read a
directory another process is writing (its writes are atomic replaces).

On NFS, Linux emulates `flock` with the server's byte-range locks; a file system
without locking (some FUSE mounts) refuses `flock`, and the run then goes ahead
unlocked with a warning rather than not at all.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any

from ..devices.distributed import is_rank0
from ..errors import (
    CheckpointError,
    NitroWarning,
    RunDirLockedError,
    user_stacklevel,
)
from .lookup import source_directory

MAX_HOLDER_BYTES = 4096  # the most of a lock file read for its holder

LOCK_NAME = ".nitro.lock"

LOCKED = (
    "The run directory {directory!r} is being written by another process: pid "
    "{pid} on host {host}{since} holds its lock ({path}). Two processes writing one "
    "run directory overwrite each other's manifest and checkpoint files, so this "
    "{purpose} is refused. Wait for that process to end (or stop it), or give this "
    'run a directory of its own, e.g. run_dir="{directory}-2". Reading the '
    "directory needs no lock: weights=, evaluate() and `nitro runs` work while it "
    "trains."
)
UNWRITABLE = (
    "The run directory {directory!r} cannot be written ({error}): this {purpose} "
    "needs to create its lock file {path} before it writes checkpoints there. Pass a "
    "writable run_dir (or a Checkpointer(dir=...) that is), or checkpointer=None to "
    "write no checkpoints."
)
UNLOCKABLE = (
    "The run directory {directory!r} cannot be locked ({error}): its file system "
    "does not support flock. The run goes ahead unlocked; make sure no other "
    "process writes this directory at the same time."
)


@dataclass(frozen=True)
class LockHolder:
    """Who holds a run directory's lock, as its lock file says.

    Attributes:
        pid: the holder's process id (None: the file names none yet).
        host: the holder's hostname (None: the file names none yet).
        since: when it took the lock, as UTC text (None: unknown).
    """

    pid: int | None
    host: str | None
    since: str | None


@dataclass
class _Held:
    """One directory this process has locked: the open lock file and its users."""

    fd: int
    users: int


_HELD: dict[str, _Held] = {}  # realpath of the directory -> its lock
_GUARD = threading.Lock()


class RunDirLock:
    """This handle's share of the process's lock on one run directory.

    Build it with `lock_run_dir`; call `release()` when the handle is done writing
    (a second call does nothing). The process's lock is dropped when its last share
    is released, or when the process ends.

    Examples:
        >>> import tempfile
        >>> directory = tempfile.mkdtemp()
        >>> first = lock_run_dir(directory, purpose="train")
        >>> second = lock_run_dir(directory, purpose="train")  # this process: shared
        >>> first.release(); second.release()
        >>> holder(directory) is None
        True
    """

    def __init__(self, key: str, directory: str) -> None:
        self._key = key
        self.directory = directory
        self.released = False

    def release(self) -> None:
        """Give up this share; the last share of the process unlocks the directory."""
        with _GUARD:
            if self.released:
                return
            self.released = True
            held = _HELD.get(self._key)
            if held is None:
                return
            held.users -= 1
            if held.users == 0:
                del _HELD[self._key]
                _unlock(held.fd)

    def __repr__(self) -> str:
        state = "released" if self.released else "held"
        return f"RunDirLock({self.directory!r}, {state})"


# The errors of a directory that refuses every write: read-only, or not permitted.
READ_ONLY = (errno.EROFS, errno.EACCES, errno.EPERM)


def lock_run_dir(directory: str, *, purpose: str) -> RunDirLock | None:
    """Lock `directory` for writing (creating it), shared within this process.

    Args:
        directory: the run directory (or a checkpointer's own `dir`).
        purpose: what will write, for the refusal ("train", "resume", ...).

    Returns:
        RunDirLock: this caller's share; None where the file system cannot lock
        (after a warning).

    Raises:
        RunDirLockedError: another process holds the lock, naming its pid and host.
    """
    directory = os.fspath(directory)
    path = os.path.join(directory, LOCK_NAME)
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as error:
        raise _unwritable(directory, path, purpose, error) from error
    key = os.path.realpath(directory)
    with _GUARD:
        held = _HELD.get(key)
        if held is not None:
            held.users += 1
            return RunDirLock(key, directory)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:
            raise _unwritable(directory, path, purpose, error) from error
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise _locked(directory, path, purpose) from None
        except OSError as error:
            os.close(fd)
            if error.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                raise
            warnings.warn(
                UNLOCKABLE.format(directory=directory, error=error),
                NitroWarning,
                stacklevel=user_stacklevel(),
            )
            return None
        _write_holder(fd)
        _HELD[key] = _Held(fd=fd, users=1)
        return RunDirLock(key, directory)


def holder(directory: str) -> LockHolder | None:
    """Who holds `directory`'s lock; None when no process holds it.

    Only tests the lock (taking and dropping it at once when free), so it never
    blocks and never keeps the directory locked. This process's own lock counts.
    """
    directory = os.fspath(directory)
    key = os.path.realpath(directory)
    path = os.path.join(directory, LOCK_NAME)
    with _GUARD:
        if key in _HELD:
            return _read_holder(path)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return _read_holder(path)
    finally:
        os.close(fd)  # closing drops a lock it took
    return None


def _unwritable(
    directory: str, path: str, purpose: str, error: OSError
) -> CheckpointError:
    return CheckpointError(
        UNWRITABLE.format(
            directory=directory,
            path=path,
            purpose=purpose,
            error=error.strerror or error,
        )
    )


def _locked(directory: str, path: str, purpose: str) -> RunDirLockedError:
    found = _read_holder(path)
    pid = found.pid if found else None
    host = found.host if found else None
    since = f" since {found.since}" if found and found.since else ""
    message = LOCKED.format(
        directory=directory,
        pid=pid if pid is not None else "(not yet written)",
        host=host if host is not None else "(not yet written)",
        since=since,
        path=path,
        purpose=purpose,
    )
    return RunDirLockedError(message, directory=directory, pid=pid, host=host)


def _write_holder(fd: int) -> None:
    """Name this process in the lock file. Written in place, not by an atomic
    replace: the lock lives on this inode, and a replace would swap it for an
    unlocked one. A reader that catches it half-written says "not yet written"."""
    text = json.dumps(
        {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        }
    )
    os.ftruncate(fd, 0)
    os.pwrite(fd, text.encode(), 0)


def _read_holder(path: str) -> LockHolder | None:
    """Who holds the lock, from the file's JSON; None when it says nothing
    readable. The file is anyone's to write: at most MAX_HOLDER_BYTES are read
    (a holder writes under 200), and JSON nested too deep says nothing."""
    try:
        with open(path, encoding="utf-8") as file:
            data: Any = json.loads(file.read(MAX_HOLDER_BYTES) or "null")
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    pid = data.get("pid")
    host = data.get("host")
    since = data.get("since")
    return LockHolder(
        pid=pid if isinstance(pid, int) else None,
        host=host if isinstance(host, str) else None,
        since=since if isinstance(since, str) else None,
    )


def _unlock(fd: int) -> None:
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_UN)
    with contextlib.suppress(OSError):
        os.close(fd)


def _forget_in_child() -> None:
    """A forked child (a data worker) does not hold its parent's locks: it closes
    its copies of the lock files, which leaves the parent's lock in place (only
    LOCK_UN or the last close of the file drops a flock)."""
    global _GUARD
    _GUARD = threading.Lock()  # the parent's may have been held at the fork
    for held in _HELD.values():
        with contextlib.suppress(OSError):
            os.close(held.fd)
    _HELD.clear()


os.register_at_fork(after_in_child=_forget_in_child)


def lock_checkpoint_dir(
    checkpointer: Any, run_dir: str, *, purpose: str, unwritable_ok: bool = False
) -> RunDirLock | None:
    """Lock the directory `checkpointer` writes (its own `dir`, else `run_dir`).

    Returns None, locking nothing, when checkpointing is off (`checkpointer` None)
    or this process is not rank 0 of a run across processes (rank 0 writes),
    and with `unwritable_ok` when the directory cannot be written at all (a
    read-only mount a handle only evaluates from): nothing can write there, so
    there is nothing to guard, and the setup probe refuses what would write.
    """
    if checkpointer is None or not is_rank0():
        return None  # in a run across processes, rank 0 alone writes
    directory = source_directory(checkpointer, run_dir)
    try:
        return lock_run_dir(directory, purpose=purpose)
    except CheckpointError as error:
        cause = error.__cause__
        if unwritable_ok and isinstance(cause, OSError) and cause.errno in READ_ONLY:
            return None
        raise
