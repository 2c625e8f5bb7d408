"""`setup_devices`: the process's accelerator, chosen once for every later run.

A process initializes its XLA client once, so which devices exist is fixed when it
starts (`JAX_PLATFORMS`, `CUDA_VISIBLE_DEVICES`, and on a CPU host
`--xla_force_host_platform_device_count` in `XLA_FLAGS`). Within that, this module
keeps two choices for the rest of the process: the backend runs compute on, and a
pinned `n_devs`. A run's `n_devs` resolves as: the `Nitro` keyword, else the pin,
else the experiment's `n_devs` method or field, else 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax

from ..errors import ConfigError
from .distributed import distributed_from_environment

BACKENDS = ("cpu", "gpu", "cuda", "rocm", "tpu")

BACKEND_NAME = (
    "setup_devices(backend={value!r}): the backend is one of {names}, or None to "
    "keep the current one ({current})."
)
BACKEND_MISSING = (
    "setup_devices(backend={value!r}): this process has no {value} devices (its "
    "backend is {current}: {error}). A process initializes its XLA client once: set "
    "JAX_PLATFORMS (and CUDA_VISIBLE_DEVICES) before starting it, or call "
    "setup_devices(backend={current!r})."
)
N_DEVS_TYPE = (
    "{where} n_devs must be a whole number >= 1, got {value!r}. Pass e.g. n_devs=2 "
    "(n_devs=1 runs on one device, without a mesh)."
)
N_DEVS_VISIBLE = (
    "{where} n_devs={value}, but only {visible} {backend} device(s) are visible to "
    "this process. Pass n_devs <= {visible}, or make more devices visible before "
    "the process starts (CUDA_VISIBLE_DEVICES on a GPU host; on a CPU host "
    "XLA_FLAGS=--xla_force_host_platform_device_count={value})."
)


@dataclass(frozen=True)
class DeviceSetup:
    """What `setup_devices` fixed for this process: a backend and an n_devs pin,
    each None when left to the defaults."""

    backend: str | None = None
    n_devs: int | None = None


_SETUP = DeviceSetup()


def current_setup() -> DeviceSetup:
    """The process's device choices as `setup_devices` last left them."""
    return _SETUP


def backend_name() -> str:
    """The backend runs compute on: the pinned one, else JAX's default."""
    return _SETUP.backend or jax.default_backend()


def visible_devices() -> list[Any]:
    """This process's devices of the run backend, in JAX's order; a mesh takes a
    prefix (of each process's, in a run across processes)."""
    return list(jax.local_devices(backend=backend_name()))


def pinned_n_devs() -> int | None:
    """The n_devs pinned by `setup_devices`, or None."""
    return _SETUP.n_devs


def check_n_devs(value: Any, where: str) -> int:
    """`value` as a device count: a whole number >= 1 that the visible devices
    hold. `where` names the setting in the message (e.g. "Nitro(...):")."""
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            whole = int(value)
        except (TypeError, ValueError):
            whole = None
        if whole is None or whole != value or isinstance(value, bool | str):
            raise ConfigError(N_DEVS_TYPE.format(where=where, value=value))
        value = whole
    if value < 1:
        raise ConfigError(N_DEVS_TYPE.format(where=where, value=value))
    visible = len(visible_devices())
    if value > visible:
        raise ConfigError(
            N_DEVS_VISIBLE.format(
                where=where, value=value, visible=visible, backend=backend_name()
            )
        )
    return value


def _check_backend(backend: str) -> str:
    current = jax.default_backend()
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ConfigError(
            BACKEND_NAME.format(
                value=backend, names=", ".join(BACKENDS), current=current
            )
        )
    try:
        devices = jax.devices(backend)
    except RuntimeError as error:
        raise ConfigError(
            BACKEND_MISSING.format(value=backend, current=current, error=error)
        ) from None
    if devices[0].platform != jax.devices()[0].platform:
        # Uncommitted computations (build_model, eager ops) follow the default device.
        jax.config.update("jax_default_device", devices[0])
    return backend


def setup_devices(
    backend: str | None = None, n_devs: int | None = None
) -> dict[str, Any]:
    """Configure this process's accelerator for every later run, and report it.

    Optional: a process that never calls it runs on JAX's default backend with
    `n_devs` 1 (or what the experiment declares). `backend` ("cpu", "gpu", "cuda",
    "rocm", "tpu") selects the devices compute runs on, among those the process
    started with. `n_devs` pins the device count every later `Nitro` shards its
    batch over, validated against the visible devices: the pin beats an
    experiment's `n_devs`, and an explicit `n_devs=` keyword on `Nitro` still wins
    for that one run. Called with no arguments, it only reports.

    The batch size is global: it is split across the devices, so it must divide by
    n_devs. In a run across processes (`NITRO_COORDINATOR` set, as under `nitro
    launch`) it joins the run first; `visible` and `n_devs` are then this
    process's, and the mesh spans n_devs devices of every process.

    To choose which GPUs a process sees, set `CUDA_VISIBLE_DEVICES` before it
    starts; n_devs takes a prefix of the visible devices.

    Args:
        backend: the backend to run on, or None to keep the current one.
        n_devs: the device count to pin (>= 1, at most the visible devices), or
            None to keep the current pin.

    Returns:
        `{"backend": str, "visible": [str, ...], "n_devs": int, "pinned": int |
        None}`: the backend in effect, its devices, the n_devs a run without an
        `n_devs` keyword or accessor gets, and the pin (None when unpinned).

    Raises:
        ConfigError: an unknown backend, a backend this process has no devices
            for, or an n_devs that is not a whole number from 1 to the number of
            visible devices; nothing is changed then.

    Examples:
        >>> report = setup_devices()
        >>> sorted(report)
        ['backend', 'n_devs', 'pinned', 'visible']
    """
    global _SETUP
    distributed_from_environment()  # before the first backend use, under a launcher
    chosen = _SETUP.backend if backend is None else _check_backend(backend)
    setup = DeviceSetup(backend=chosen, n_devs=_SETUP.n_devs)
    if n_devs is not None:
        previous, _SETUP = _SETUP, setup  # validate against the chosen backend
        try:
            count = check_n_devs(n_devs, "setup_devices(...):")
        finally:
            _SETUP = previous
        setup = DeviceSetup(backend=chosen, n_devs=count)
    _SETUP = setup
    return device_report()


def device_report() -> dict[str, Any]:
    """What `setup_devices()` reports, changing nothing."""
    return {
        "backend": backend_name(),
        "visible": [str(d) for d in visible_devices()],
        "n_devs": _SETUP.n_devs or 1,
        "pinned": _SETUP.n_devs,
    }
