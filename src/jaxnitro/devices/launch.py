"""`nitro launch`: N local processes of one script, joined as one multi-process run.

Each process gets the environment `init_distributed` reads (`NITRO_COORDINATOR` on
loopback, `NITRO_NUM_PROCESSES`, `NITRO_PROCESS_ID`), so an unchanged training
script runs across them. Their output comes back line by line, prefixed with the
rank. When one process fails, the launcher stops the others (SIGTERM, then SIGKILL
after a grace period: a process blocked in a collective on a dead peer does not
answer SIGTERM) and returns the first failure's status, so a crashed rank never
leaves the rest waiting forever. It is the local stand-in for a cluster's own
launcher (SLURM's srun, a TPU pod's per-host start), for testing a run across
processes on one machine.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import IO

from ..errors import ConfigError
from .distributed import (
    COORDINATOR_ENV,
    HEARTBEAT_TIMEOUT_ENV,
    NUM_PROCESSES_ENV,
    PROCESS_ID_ENV,
)

# How often the launcher looks at its processes.
POLL_S = 0.05


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def rank_environment(
    rank: int, n: int, port: int, heartbeat_s: int | None = None
) -> dict[str, str]:
    """The environment of process `rank` of `n` with the coordinator on `port`.

    Examples:
        >>> env = rank_environment(1, 2, 9471)
        >>> env["NITRO_COORDINATOR"], env["NITRO_PROCESS_ID"]
        ('127.0.0.1:9471', '1')
    """
    env = {
        **os.environ,
        COORDINATOR_ENV: f"127.0.0.1:{port}",
        NUM_PROCESSES_ENV: str(n),
        PROCESS_ID_ENV: str(rank),
        "PYTHONUNBUFFERED": "1",  # lines arrive as they are printed
    }
    if heartbeat_s is not None:
        env[HEARTBEAT_TIMEOUT_ENV] = str(heartbeat_s)
    return env


def _forward(rank: int, pipe: IO[str], out: IO[str], lock: threading.Lock) -> None:
    for line in pipe:
        with lock:
            out.write(f"[rank {rank}] {line}")
            out.flush()


def _status(code: int) -> int:
    """A process's exit status as a shell reports it (128 + N for signal N)."""
    return 128 - code if code < 0 else code


def _describe(code: int) -> str:
    if code < 0:
        return f"was killed by signal {-code} ({signal.Signals(-code).name})"
    return f"exited with status {code}"


class Launch:
    """N processes of one command as one multi-process run; `wait()` for them.

    Attributes:
        processes: the started processes, by rank.
    """

    def __init__(
        self,
        command: Sequence[str],
        *,
        n: int,
        port: int | None = None,
        heartbeat_s: int | None = None,
        out: IO[str] | None = None,
        err: IO[str] | None = None,
    ) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(
                f"nitro launch -n {n!r}: the number of processes is a whole number "
                f">= 1 (e.g. -n 2)."
            )
        if not command:
            raise ConfigError(
                "nitro launch needs a script to run: nitro launch -n 2 train.py "
                "[its arguments]."
            )
        self._out = out or sys.stdout
        self._err = err or sys.stderr
        self._lock = threading.Lock()
        self.port = free_port() if port is None else port
        argv = [sys.executable, *command]
        self.processes = [
            subprocess.Popen(
                argv,
                env=rank_environment(rank, n, self.port, heartbeat_s),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for rank in range(n)
        ]
        self._readers = [
            threading.Thread(
                target=_forward,
                args=(rank, p.stdout, self._out, self._lock),
                daemon=True,
            )
            for rank, p in enumerate(self.processes)
        ]
        for reader in self._readers:
            reader.start()

    def _say(self, message: str) -> None:
        with self._lock:
            self._err.write(f"nitro launch: {message}\n")
            self._err.flush()

    def stop(self, grace_s: float) -> None:
        """SIGTERM every process still running, then SIGKILL what is left after
        `grace_s` seconds; return once all have ended."""
        running = [p for p in self.processes if p.poll() is None]
        for p in running:
            p.terminate()
        deadline = time.monotonic() + grace_s
        for p in running:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def wait(self, *, grace_s: float = 10.0, timeout_s: float | None = None) -> int:
        """Wait for every process; 0 when all succeed, else the first failure's
        exit status (the others stopped then), or 124 after `timeout_s`."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            while True:
                codes = [p.poll() for p in self.processes]
                failed = [
                    (rank, code)
                    for rank, code in enumerate(codes)
                    if code not in (None, 0)
                ]
                if failed:
                    rank, code = failed[0]
                    others = [r for r, c in enumerate(codes) if c is None]
                    if others:
                        self._say(
                            f"rank {rank} {_describe(code)}; stopping rank(s) "
                            f"{', '.join(map(str, others))} (SIGTERM, then SIGKILL "
                            f"after {grace_s:g}s)."
                        )
                    else:
                        self._say(f"rank {rank} {_describe(code)}.")
                    self.stop(grace_s)
                    return _status(code)
                if all(code == 0 for code in codes):
                    return 0
                if deadline is not None and time.monotonic() >= deadline:
                    self._say(
                        f"the run did not finish within --timeout {timeout_s:g}s; "
                        f"stopping every rank."
                    )
                    self.stop(grace_s)
                    return 124
                time.sleep(POLL_S)
        except KeyboardInterrupt:
            self.stop(grace_s)
            return 130
        finally:
            for reader, process in zip(self._readers, self.processes, strict=True):
                reader.join(timeout=1.0)  # the rest of its output, once it ended
                if not reader.is_alive() and process.stdout is not None:
                    process.stdout.close()


def launch(
    command: Sequence[str],
    *,
    n: int,
    port: int | None = None,
    heartbeat_s: int | None = None,
    grace_s: float = 10.0,
    timeout_s: float | None = None,
) -> int:
    """Run `python *command` as `n` processes of one run on a loopback
    coordinator, and return the exit status `nitro launch` exits with.

    Args:
        command: the script and its arguments (or `-m module ...`).
        n: the processes to start.
        port: the coordinator's port on 127.0.0.1 (default: a free one).
        heartbeat_s: NITRO_HEARTBEAT_TIMEOUT for the processes: how long a silent
            peer may go before the others stop with an error.
        grace_s: how long a process may take to stop after SIGTERM.
        timeout_s: stop every process after this long (exit status 124).

    Returns:
        0 when every process succeeded; else the first failure's status.
    """
    return Launch(command, n=n, port=port, heartbeat_s=heartbeat_s).wait(
        grace_s=grace_s, timeout_s=timeout_s
    )
