"""Hold a run directory's lock as another process would (tests of the lock)."""

from __future__ import annotations

import fcntl
import json
import os

from jaxnitro.checkpoint.lock import LOCK_NAME


def foreign_lock(directory, *, pid: int = 4242, host: str = "gpu-node-7") -> int:
    """Lock `directory` through an open file of our own, naming `pid` on `host`:
    to the lock it is another holder, as another process is (flock locks an open
    file). Returns the file descriptor; closing it drops the lock."""
    os.makedirs(directory, exist_ok=True)
    fd = os.open(os.path.join(directory, LOCK_NAME), os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    text = json.dumps({"pid": pid, "host": host, "since": "2026-12-01 10:00:00 UTC"})
    os.ftruncate(fd, 0)
    os.pwrite(fd, text.encode(), 0)
    return fd
