"""`Distributed`: this process's place in a multi-process run, and how it joins one.

A run across processes (several hosts, or several processes on one host) is one
`jax.distributed` job: every process runs the same script, and each sees its own
local devices plus, through the coordinator, every other process's. One process
(rank 0) also hosts the coordinator service the others connect to.

A process joins with `init_distributed(...)`, or without a call when the environment
names the job (`NITRO_COORDINATOR`, `NITRO_NUM_PROCESSES`, `NITRO_PROCESS_ID`, which
`nitro launch` sets): `setup_devices()` and every `Nitro(...)` join first. Either
must happen before anything uses a JAX backend.

JAX ends a process whose coordinator never answers with an abort, not an exception,
so a process other than rank 0 first waits for the coordinator's port to accept a
connection itself, and raises `DistributedError` naming the address and the
timeout. Once joined, JAX's heartbeats end every process when one dies: after
`heartbeat_timeout_s` without a heartbeat the survivors stop with an error instead
of waiting forever inside a collective.

In one process there is no handle: `current_dist()` is None, and `rank(None) == 0`,
`world_size(None) == 1`.

    >>> rank(None), world_size(None)
    (0, 1)
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from ..errors import ConfigError, DistributedError

# The environment `nitro launch` sets for each process it starts.
COORDINATOR_ENV = "NITRO_COORDINATOR"
NUM_PROCESSES_ENV = "NITRO_NUM_PROCESSES"
PROCESS_ID_ENV = "NITRO_PROCESS_ID"
INIT_TIMEOUT_ENV = "NITRO_INIT_TIMEOUT"
HEARTBEAT_TIMEOUT_ENV = "NITRO_HEARTBEAT_TIMEOUT"
# JAX's defaults are 300 s and 100 s; a dead peer is noticed sooner here.
DEFAULT_INIT_TIMEOUT_S = 300
DEFAULT_HEARTBEAT_TIMEOUT_S = 30

# The coordinator address this process joined through (None: JAX detected it).
_joined_at: str | None = None

COORDINATOR_SILENT = (
    "Process {process_id} of {num_processes}: the coordinator at {address} did not "
    "answer within {timeout}s (initialization timeout). Start rank 0 (process 0) "
    "with the same coordinator address, check that {address} is its host and a port "
    "it can open and that no firewall is in the way, or raise the timeout "
    "(init_distributed(timeout_s=...) or {env})."
)
COORDINATOR_PORT_TAKEN = (
    "Process 0 hosts the coordinator at {address}, but port {port} is already in "
    "use on this host ({error}). Choose a free port (`nitro launch --port P`, or "
    "{coordinator_env}=host:P for every process)."
)
ALREADY_STARTED = (
    "init_distributed({address}) must run before anything uses a JAX backend, and "
    "this process has already used one ({error}). Call jaxnitro.init_distributed() "
    "(or setup_devices()) at the top of the script, before building arrays or "
    "calling jax.devices()."
)
JOIN_FAILED = (
    "init_distributed could not join a multi-process job: {error}. Name the job "
    "(init_distributed(coordinator='host:port', num_processes=N, process_id=i), or "
    "the {coordinator_env}, {num_env} and {id_env} environment variables), or run "
    "under a cluster JAX detects (SLURM, Open MPI, Cloud TPU)."
)
BAD_SETTING = "{name}={value!r}: it must be {what}. {fix}"
ADDRESS_FORM = (
    "coordinator={value!r}: it must be 'host:port' (e.g. '127.0.0.1:9471' or "
    "'node001:9471'), the address rank 0 listens on and every process connects to."
)


@dataclass(frozen=True)
class Distributed:
    """This process's place in a multi-process run; what `build_data` gets as `dist`.

    Attributes:
        rank: this process's index, 0 to world_size - 1 (`jax.process_index()`).
        world_size: the number of processes (`jax.process_count()`).
        local_devices: the devices this process drives.
        devices: every process's devices, in JAX's order.
        coordinator: the coordinator's "host:port", or None when JAX found the
            job itself (a cluster's auto-detection).
    """

    rank: int
    world_size: int
    local_devices: tuple[Any, ...]
    devices: tuple[Any, ...]
    coordinator: str | None

    @property
    def is_rank0(self) -> bool:
        """Whether this process logs and writes checkpoints."""
        return self.rank == 0

    def shard(self, array: Any, batch_size: int, *, drop_last: bool = True) -> Any:
        """This process's rows of `array` (n, ...), for a source with batches of
        `batch_size // world_size` rows whose global batches are `array`'s batches
        of `batch_size`: global batch k is rows [k*B, (k+1)*B), and this process
        holds its rank's consecutive slice of each. A trailing partial batch is
        dropped (a train split drops it anyway), or with `drop_last=False` split
        as evenly as it goes, lower ranks first (an eval split keeps every row:
        its batches' parts, joined rank by rank, are the whole batches again).

        Examples:
            >>> dist = Distributed(1, 2, (), (), None)
            >>> dist.shard(np.arange(10), 4).tolist()
            [2, 3, 6, 7]
            >>> dist.shard(np.arange(10), 4, drop_last=False).tolist()
            [2, 3, 6, 7, 9]
        """
        array = np.asarray(array)
        if batch_size % self.world_size:
            raise ConfigError(
                f"Distributed.shard(batch_size={batch_size}): the global batch must "
                f"divide by the {self.world_size} processes, each feeding "
                f"batch_size / {self.world_size} rows. Use a multiple of "
                f"{self.world_size}."
            )
        local = batch_size // self.world_size
        whole = len(array) // batch_size * batch_size
        blocks = array[:whole].reshape(-1, self.world_size, local, *array.shape[1:])
        mine = blocks[:, self.rank].reshape(-1, *array.shape[1:])
        if drop_last or whole == len(array):
            return mine
        rest = np.array_split(array[whole:], self.world_size)[self.rank]
        return np.concatenate([mine, rest])


def rank(dist: Distributed | None) -> int:
    """This process's rank; 0 in a run of one process (`dist` None)."""
    return 0 if dist is None else dist.rank


def world_size(dist: Distributed | None) -> int:
    """The number of processes; 1 in a run of one process (`dist` None)."""
    return 1 if dist is None else dist.world_size


def is_rank0() -> bool:
    """Whether this process is rank 0 (the one that logs and writes); True unless
    `jax.distributed` says otherwise. Never starts a JAX backend."""
    return not jax.distributed.is_initialized() or jax.process_index() == 0


def current_dist() -> Distributed | None:
    """This process's handle when it is one of several joined processes, else None."""
    if not jax.distributed.is_initialized() or jax.process_count() == 1:
        return None
    return Distributed(
        rank=jax.process_index(),
        world_size=jax.process_count(),
        local_devices=tuple(jax.local_devices()),
        devices=tuple(jax.devices()),
        coordinator=_joined_at,
    )


def _whole(name: str, value: Any, least: int, fix: str) -> int:
    """`value` (an int, or its text from the environment) as a whole number >=
    `least`; `fix` ends the refusal."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = None
    if (
        number is None
        or isinstance(value, bool)
        or str(number) != str(value).strip()
        or number < least
    ):
        raise ConfigError(
            BAD_SETTING.format(
                name=name, value=value, what=f"a whole number >= {least}", fix=fix
            )
        )
    return number


def _split_address(address: str) -> tuple[str, int]:
    host, _, port = str(address).rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(ADDRESS_FORM.format(value=address))
    return host.strip("[]"), int(port)


def _wait_for_coordinator(
    address: str, timeout_s: float, process_id: int, num_processes: int
) -> None:
    """Return once `address` accepts a TCP connection; raise after `timeout_s`."""
    host, port = _split_address(address)
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=max(0.1, min(1, left))):
                return
        except OSError:
            if time.monotonic() >= deadline:
                raise DistributedError(
                    COORDINATOR_SILENT.format(
                        process_id=process_id,
                        num_processes=num_processes,
                        address=address,
                        timeout=timeout_s,
                        env=INIT_TIMEOUT_ENV,
                    )
                ) from None
            time.sleep(0.1)


def _check_port_free(address: str) -> None:
    """Rank 0 binds the coordinator's port: refuse one already taken by name."""
    _, port = _split_address(address)
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("", port))
    except OSError as error:
        raise DistributedError(
            COORDINATOR_PORT_TAKEN.format(
                address=address, port=port, error=error, coordinator_env=COORDINATOR_ENV
            )
        ) from None
    finally:
        probe.close()


def _from_env(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    return value if value not in (None, "") else None


def init_distributed(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    local_device_ids: list[int] | None = None,
    timeout_s: float | None = None,
    heartbeat_timeout_s: int | None = None,
) -> Distributed | None:
    """Join this process to a multi-process run (`jax.distributed.initialize`).

    Every process of the job calls it with the same `coordinator` and
    `num_processes` and its own `process_id`, before anything uses a JAX backend.
    An argument left None is read from the environment (`NITRO_COORDINATOR`,
    `NITRO_NUM_PROCESSES`, `NITRO_PROCESS_ID`, `NITRO_INIT_TIMEOUT`,
    `NITRO_HEARTBEAT_TIMEOUT`; `nitro launch` sets them), and with no coordinator
    at all JAX detects the job itself (SLURM, Open MPI, Cloud TPU); when nothing
    names a job and JAX finds none, the process runs alone and it returns None,
    so one script runs both ways. Calling it again in a joined process returns the
    handle and changes nothing.

    Args:
        coordinator: "host:port" of rank 0, which hosts the coordinator service.
        num_processes: the processes of the job.
        process_id: this process's rank, 0 to num_processes - 1.
        local_device_ids: the local devices this process drives (None: all).
        timeout_s: how long to wait for the coordinator and the other processes
            (default 300).
        heartbeat_timeout_s: how long a silent process may go before the others
            stop with an error (default 30): what bounds the wait for a dead peer.

    Returns:
        The process's `Distributed` handle; None when the job has one process
        (or there is no job).

    Raises:
        DistributedError: the coordinator did not answer within `timeout_s`
            (naming its address), rank 0's port is taken, a backend was already
            in use, or JAX could not find the job.
        ConfigError: a setting that is not a whole number or a host:port.
    """
    if jax.distributed.is_initialized():
        return current_dist()
    env = os.environ
    coordinator = coordinator or _from_env(env, COORDINATOR_ENV)
    if num_processes is None and _from_env(env, NUM_PROCESSES_ENV) is not None:
        num_processes = env[NUM_PROCESSES_ENV]  # type: ignore[assignment]
    if process_id is None and _from_env(env, PROCESS_ID_ENV) is not None:
        process_id = env[PROCESS_ID_ENV]  # type: ignore[assignment]
    timeout = _whole(
        "timeout_s",
        timeout_s
        if timeout_s is not None
        else env.get(INIT_TIMEOUT_ENV) or DEFAULT_INIT_TIMEOUT_S,
        1,
        f"Seconds to wait for the coordinator (or set {INIT_TIMEOUT_ENV}).",
    )
    heartbeat = _whole(
        "heartbeat_timeout_s",
        heartbeat_timeout_s
        if heartbeat_timeout_s is not None
        else env.get(HEARTBEAT_TIMEOUT_ENV) or DEFAULT_HEARTBEAT_TIMEOUT_S,
        2,
        f"Seconds before a silent process counts as dead ({HEARTBEAT_TIMEOUT_ENV}).",
    )
    count = None
    index = None
    if num_processes is not None:
        count = _whole(
            "num_processes",
            num_processes,
            1,
            f"The job's processes ({NUM_PROCESSES_ENV}).",
        )
    if process_id is not None:
        index = _whole("process_id", process_id, 0, f"This rank ({PROCESS_ID_ENV}).")
        if count is not None and index >= count:
            raise ConfigError(
                f"process_id={index} with num_processes={count}: the ranks are 0 to "
                f"{count - 1}."
            )
    alone = coordinator is None and count is None and index is None
    if coordinator is not None:
        _split_address(coordinator)
        if index is not None and count is not None and count > 1:
            if index == 0:
                _check_port_free(coordinator)
            else:
                _wait_for_coordinator(coordinator, timeout, index, count)
    try:
        jax.distributed.initialize(
            coordinator_address=coordinator,
            num_processes=count,
            process_id=index,
            local_device_ids=local_device_ids,
            initialization_timeout=timeout,
            heartbeat_timeout_seconds=heartbeat,
        )
    except RuntimeError as error:
        if "must be called before" in str(error):
            raise DistributedError(
                ALREADY_STARTED.format(address=coordinator or "", error=error)
            ) from error
        raise DistributedError(_join_failed(error)) from error
    except ValueError as error:
        if alone:  # nothing names a job and JAX found none: one process
            return None
        raise DistributedError(_join_failed(error)) from error
    global _joined_at
    _joined_at = coordinator
    return current_dist()


def _join_failed(error: Exception) -> str:
    return JOIN_FAILED.format(
        error=str(error).rstrip("."),
        coordinator_env=COORDINATOR_ENV,
        num_env=NUM_PROCESSES_ENV,
        id_env=PROCESS_ID_ENV,
    )


def distributed_from_environment() -> Distributed | None:
    """Join the job the environment names (`NITRO_COORDINATOR` set, as under
    `nitro launch`) unless joined already; this process's handle, or None."""
    if not jax.distributed.is_initialized() and _from_env(os.environ, COORDINATOR_ENV):
        return init_distributed()
    return current_dist()


PROCESSES_DISAGREE = (
    "The {count} processes of this run feed different data: {shown}. Every process "
    "must feed the same number of batches in each split, of the same size (its "
    "shard of each global batch; an eval split's short last batch aside), or the "
    "ones that finish first leave the others waiting in a collective. Shard every "
    "split evenly by rank (e.g. dist.shard(array, batch_size))."
)


def agree_across_processes(values: Mapping[str, int]) -> None:
    """Refuse processes whose `values` (name -> whole number) differ, naming each
    process's; a collective, so every process of the run must call it."""
    from jax.experimental import multihost_utils

    if jax.process_count() == 1:
        return
    names = list(values)
    mine = np.array([int(values[n]) for n in names], dtype=np.int64)
    every = np.asarray(multihost_utils.process_allgather(mine))
    if (every == every[0]).all():
        return
    shown = "; ".join(
        f"{name}: "
        + ", ".join(f"rank {r} {int(every[r, i])}" for r in range(len(every)))
        for i, name in enumerate(names)
        if not (every[:, i] == every[0, i]).all()
    )
    raise DistributedError(
        PROCESSES_DISAGREE.format(count=jax.process_count(), shown=shown)
    )
