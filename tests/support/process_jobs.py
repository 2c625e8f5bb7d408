"""What the multi-process tests give the processes they start: an environment and a
free loopback port."""

from __future__ import annotations

import os
import socket
from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
SRC = SUPPORT.parents[1] / "src"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listened on a moment ago."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def child_path(*first: str) -> str:
    """A child's PYTHONPATH: `first`, the package and the test support, then this
    process's PYTHONPATH (where JAX itself may live, as on a TPU machine)."""
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join([*first, str(SRC), str(SUPPORT), *inherited])


def child_env(devices: int = 1, **extra: str) -> dict[str, str]:
    """A child's environment: the package and the test support on its path (before
    this process's PYTHONPATH), CPU with `devices` fake devices, no job named unless
    `extra` names one."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("NITRO_", "JAX_COORD"))
    }
    env.update(
        PYTHONPATH=child_path(),
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
        JAX_PLATFORMS="cpu",
        JAXNITRO_COMPILATION_CACHE="off",
        **extra,
    )
    return env
