"""What a test may need that a machine can lack, and the reason it is skipped there.

Three markers (registered in pyproject.toml) name a need; `missing` says, for a
test's markers, what this machine lacks, or None. A CPU host with loopback and four
fake devices (CI) lacks nothing. A TPU machine may have one chip, no sockets, and a
chip only one process can hold: there the test is skipped with the reason.

- `needs_sockets`: the test opens a TCP socket (a server, a coordinator, a free
  port). Probed once: can a socket bind on 127.0.0.1 and another connect to it?
  `needs_sockets("pair")`: it needs only `socket.socketpair()`, as every asyncio
  event loop does (its wakeup channel); probed by making one.
- `needs_devices(n)`: the test needs n JAX devices of the default backend (a mesh,
  a sharded layout).
- `needs_processes`: the test starts processes that open the default backend while
  this one holds it; only one process can hold an accelerator, so they need the CPU
  backend. A child started with JAX_PLATFORMS=cpu (`process_jobs.child_env`) needs
  no mark.
"""

from __future__ import annotations

import functools
import socket
from collections.abc import Iterable
from typing import Any

LOOPBACK = "127.0.0.1"

SOCKETS_ARGUMENT = (
    "needs_sockets takes no argument (a TCP socket on loopback) or the kind 'tcp' or "
    "'pair' (socket.socketpair(), an asyncio event loop), e.g. "
    "@pytest.mark.needs_sockets('pair'); got args={args!r} kwargs={kwargs!r}."
)
DEVICES_ARGUMENT = (
    "needs_devices takes one whole number >= 1, the devices the test needs, e.g. "
    "@pytest.mark.needs_devices(4); got args={args!r} kwargs={kwargs!r}."
)


@functools.cache
def loopback_error() -> str | None:
    """Why a TCP socket on 127.0.0.1 cannot bind and take a connection, or None
    when it can. Probed once per process."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
            server.bind((LOOPBACK, 0))
            server.listen(1)
            with socket.create_connection(server.getsockname()[:2], timeout=5):
                pass
    except OSError as error:
        return f"{type(error).__name__}: {error}"
    return None


@functools.cache
def socketpair_error() -> str | None:
    """Why `socket.socketpair()` fails, or None when it works. Probed once."""
    try:
        first, second = socket.socketpair()
    except OSError as error:
        return f"{type(error).__name__}: {error}"
    first.close()
    second.close()
    return None


def device_count() -> int:
    """The devices of the default backend (JAX's count, every process's)."""
    import jax

    return jax.device_count()


def default_backend() -> str:
    """JAX's default backend ("cpu", "gpu", "tpu")."""
    import jax

    return jax.default_backend()


def socket_kind(mark: Any) -> str:
    """The kind of a `needs_sockets` mark, "tcp" or "pair"; a ValueError naming the
    use otherwise."""
    args, kwargs = tuple(mark.args), dict(mark.kwargs)
    if not args and not kwargs:
        return "tcp"
    if kwargs or len(args) != 1 or args[0] not in ("tcp", "pair"):
        raise ValueError(SOCKETS_ARGUMENT.format(args=args, kwargs=kwargs))
    return args[0]


def devices_needed(mark: Any) -> int:
    """The n of a `needs_devices(n)` mark; a ValueError naming the use otherwise."""
    args, kwargs = tuple(mark.args), dict(mark.kwargs)
    if (
        kwargs
        or len(args) != 1
        or isinstance(args[0], bool)
        or not isinstance(args[0], int)
        or args[0] < 1
    ):
        raise ValueError(DEVICES_ARGUMENT.format(args=args, kwargs=kwargs))
    return args[0]


def missing(marks: Iterable[Any]) -> str | None:
    """What this machine lacks of what `marks` (a test's markers) need, as the
    reason to skip it; None when it has all of it."""
    reasons = []
    for mark in marks:
        if mark.name == "needs_sockets" and socket_kind(mark) == "tcp":
            error = loopback_error()
            if error is not None:
                reasons.append(
                    f"needs sockets: a TCP socket on {LOOPBACK} cannot bind and "
                    f"connect here ({error})"
                )
        elif mark.name == "needs_sockets":
            error = socketpair_error()
            if error is not None:
                reasons.append(
                    "needs sockets: socket.socketpair(), which an asyncio event loop "
                    f"makes, fails here ({error})"
                )
        elif mark.name == "needs_devices":
            needed, present = devices_needed(mark), device_count()
            if present < needed:
                reasons.append(
                    f"needs {needed} devices of the default backend; this process "
                    f"has {present} ({default_backend()})"
                )
        elif mark.name == "needs_processes":
            backend = default_backend()
            if backend != "cpu":
                reasons.append(
                    "starts processes on the default backend; only one process can "
                    f"hold the {backend} devices, and this one does"
                )
    return "; ".join(dict.fromkeys(reasons)) or None
