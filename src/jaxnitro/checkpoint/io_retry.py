"""`with_io_retry`: checkpoint I/O that survives a transient file-system hiccup.

A failed checkpoint write can lose hours of training, so every checkpoint read, write
and rotation delete goes through `with_io_retry`. Only errors a retry can cure are
retried: an interrupted call (EINTR), a resource that is busy or temporarily
unavailable (EBUSY, EAGAIN), a timeout (ETIMEDOUT) and a stale network file handle
(ESTALE). Everything else is re-raised at once: a missing file, a permission error, a
full disk (ENOSPC: waiting a few seconds rarely frees space, and failing fast says
what is wrong while the run's last checkpoint is still intact), an I/O error from the
device (EIO), and every non-OSError.
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable
from typing import TypeVar

from ..errors import ConfigError

T = TypeVar("T")

log = logging.getLogger("jaxnitro.checkpoint")

TRANSIENT_ERRNOS = frozenset(
    code
    for code in (
        errno.EINTR,
        errno.EAGAIN,
        errno.EWOULDBLOCK,
        errno.EBUSY,
        errno.ETIMEDOUT,
        getattr(errno, "ESTALE", None),
    )
    if code is not None
)


def is_transient_io(error: BaseException) -> bool:
    """Whether `error` is an I/O error that the same call may not raise again.

    Examples:
        >>> import errno
        >>> is_transient_io(OSError(errno.EBUSY, "busy"))
        True
        >>> is_transient_io(FileNotFoundError(errno.ENOENT, "gone"))
        False
    """
    if isinstance(error, InterruptedError | BlockingIOError | TimeoutError):
        return True
    return isinstance(error, OSError) and error.errno in TRANSIENT_ERRNOS


def with_io_retry(
    fn: Callable[[], T],
    *,
    attempts: int = 5,
    backoff: float = 0.5,
    what: str = "checkpoint I/O",
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call `fn()`, retrying a transient I/O error with exponential backoff.

    Attempt `k` (from 1) that fails transiently waits `backoff * 2**(k - 1)` seconds
    before the next; each retry logs a warning on the `jaxnitro.checkpoint` logger.
    Any other error, and the error of the last attempt, is re-raised unchanged.

    Args:
        fn: the operation, taking no arguments; it must be safe to repeat.
        attempts: calls in total, >= 1.
        backoff: the first wait in seconds, >= 0.
        what: how the log names the operation.
        sleep: the wait function (tests pass a fake).

    Examples:
        >>> with_io_retry(lambda: 42)
        42
    """
    if not isinstance(attempts, int) or attempts < 1:
        raise ConfigError(f"with_io_retry needs attempts >= 1, got {attempts!r}.")
    if backoff < 0:
        raise ConfigError(f"with_io_retry needs backoff >= 0, got {backoff!r}.")
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except OSError as error:
            if attempt == attempts or not is_transient_io(error):
                raise
            wait = backoff * 2 ** (attempt - 1)
            log.warning(
                "%s failed with a transient error (%s); retry %d of %d in %.2f s.",
                what,
                error,
                attempt,
                attempts - 1,
                wait,
            )
            sleep(wait)
    raise AssertionError("unreachable")  # pragma: no cover
