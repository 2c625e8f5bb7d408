"""Phase monitors: the functions told of every phase transition, and their registries.

A monitor is `f(phase, step, epoch, info)`, so a heartbeat, a watchdog or a dashboard
can be written outside the framework. There are two registries:

* the module-level one, `register_phase_monitor(f)`: copied into each handle at the
  handle's next entry point (`observe.entry`), including handles already built;
* a handle's own, `register_phase_monitor(f, nitro=n)`: takes effect at once.

A handle fires the module-level monitors it copied, in registration order, then its own.
Unregistering a module-level monitor stops later copies but leaves the handles that
already copied it alone. A monitor that raises is warned about once and stays
registered; the run goes on. Registration is safe from any thread while a run is
publishing: a registry is copy-on-write under a lock, and dispatch reads a snapshot.

Example:
    >>> seen = []
    >>> handle = register_phase_monitor(lambda p, s, e, i: seen.append(p))
    >>> from .phases import Starting
    >>> module_registry().publish(Starting(), None, None, PhaseInfo())
    >>> seen
    [Starting()]
    >>> unregister_phase_monitor(handle)
"""

from __future__ import annotations

import inspect
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ..errors import NitroWarning
from .phases import Phase

PhaseMonitor = Callable[[Phase, "int | None", "int | None", "PhaseInfo"], object]
"""`f(phase, step, epoch, info)`; the return value is ignored."""


class PhaseInfo(Mapping[str, Any]):
    """What a monitor gets besides the phase: `nitro`, `logger`, `is_rank0`, extras.

    Read it as attributes (`info.logger`, as the spec writes it) or as a mapping
    (`info.get("metrics")`). `metrics` is present only on the transition out of
    EvalStepping; `epoch_started` (the epoch's number) only when TrainStepping is
    published at the start of a training epoch, which happens every epoch, even
    when the run was already in TrainStepping; `nitro` and `logger` are None while
    `Nitro(e)` is being built.

    Examples:
        >>> info = PhaseInfo(logger="lg", metrics={"loss": 0.5})
        >>> info.logger, info["metrics"], info.nitro, info.is_rank0
        ('lg', {'loss': 0.5}, None, True)
        >>> sorted(info)
        ['is_rank0', 'logger', 'metrics', 'nitro']
    """

    __slots__ = ("_items",)

    def __init__(
        self,
        *,
        nitro: Any = None,
        logger: Any = None,
        is_rank0: bool = True,
        **extra: Any,
    ) -> None:
        items = {"nitro": nitro, "logger": logger, "is_rank0": is_rank0}
        items.update(extra)
        object.__setattr__(self, "_items", items)

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __getattr__(self, name: str) -> Any:
        try:
            return self._items[name]
        except KeyError:
            raise AttributeError(
                f"PhaseInfo has no `{name}`: this transition carries "
                f"{', '.join(self._items)}. `metrics` comes only with the transition "
                f"out of EvalStepping; read optional keys with info.get({name!r})."
            ) from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(
            f"PhaseInfo is read-only: cannot set `{name}`. Every monitor sees the same "
            f"info; keep a monitor's own state in the monitor."
        )

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in self._items.items())
        return f"PhaseInfo({shown})"


class MonitorHandle:
    """What `register_phase_monitor` returns; `unregister_phase_monitor` takes it.

    It records the registry the monitor was added to, so one function removes both
    forms. A module-level monitor and the copies handles made of it share this
    object, so a monitor that raises is warned about once, wherever it ran.
    """

    __slots__ = ("fn", "registry", "_warned")

    def __init__(self, fn: PhaseMonitor, registry: MonitorRegistry) -> None:
        self.fn = fn
        self.registry = registry
        self._warned = False

    def call(
        self, phase: Phase, step: int | None, epoch: int | None, info: PhaseInfo
    ) -> None:
        """Call the monitor; an exception is warned about once and swallowed."""
        try:
            self.fn(phase, step, epoch, info)
        except Exception as error:
            if self._warned:
                return
            self._warned = True
            warnings.warn(
                f"Phase monitor {_name(self.fn)} raised {type(error).__name__}: "
                f"{error} on {phase!r}. The run goes on and the monitor stays "
                f"registered; further errors from it are not reported. Fix the "
                f"monitor, or remove it with unregister_phase_monitor(handle).",
                NitroWarning,
                stacklevel=2,
            )

    def __repr__(self) -> str:
        where = "module-level" if self.registry is _MODULE else "per-handle"
        return f"MonitorHandle({_name(self.fn)}, {where})"


class MonitorRegistry:
    """The monitors one handle fires: copies of module-level ones, then its own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._adopted: tuple[MonitorHandle, ...] = ()
        self._own: tuple[MonitorHandle, ...] = ()
        self._ever_adopted: set[MonitorHandle] = set()

    def add(self, fn: PhaseMonitor) -> MonitorHandle:
        """Register `fn` here, after the monitors already registered."""
        handle = MonitorHandle(fn, self)
        with self._lock:
            self._own = (*self._own, handle)
        return handle

    def remove(self, handle: MonitorHandle) -> None:
        """Remove `handle` (own or copied) from this registry; absent is a no-op."""
        with self._lock:
            self._own = tuple(h for h in self._own if h is not handle)
            self._adopted = tuple(h for h in self._adopted if h is not handle)

    def adopt(self, source: MonitorRegistry) -> int:
        """Copy `source`'s monitors that this registry has never copied; how many.

        A monitor copied once and removed since is not copied again.
        """
        offered = source.own()
        with self._lock:
            fresh = tuple(h for h in offered if h not in self._ever_adopted)
            self._ever_adopted.update(fresh)
            self._adopted = (*self._adopted, *fresh)
        return len(fresh)

    def own(self) -> tuple[MonitorHandle, ...]:
        """The monitors registered directly here, in registration order."""
        return self._own

    def monitors(self) -> tuple[MonitorHandle, ...]:
        """Every monitor fired here, in firing order."""
        return self._adopted + self._own

    def publish(
        self, phase: Phase, step: int | None, epoch: int | None, info: PhaseInfo
    ) -> None:
        """Call every monitor on a snapshot: copies first, then the registry's own."""
        for handle in self._adopted + self._own:
            handle.call(phase, step, epoch, info)

    def __repr__(self) -> str:
        return f"MonitorRegistry({len(self._adopted)} copied, {len(self._own)} own)"


_MODULE = MonitorRegistry()


def module_registry() -> MonitorRegistry:
    """The module-level registry: what `register_phase_monitor(f)` adds to."""
    return _MODULE


def registry_of(nitro: Any) -> MonitorRegistry:
    """The registry of a handle: anything with a `phase_recorder`, or a recorder."""
    recorder = getattr(nitro, "phase_recorder", nitro)
    registry = getattr(recorder, "monitors", None)
    if not isinstance(registry, MonitorRegistry):
        raise TypeError(
            f"nitro= must be a Nitro (or its phase_recorder); got "
            f"{type(nitro).__name__}, which has no phase monitors. Pass the handle, "
            f"as in register_phase_monitor(f, nitro=nitro), or leave nitro out to "
            f"register module-level."
        )
    return registry


def register_phase_monitor(fn: PhaseMonitor, nitro: Any = None) -> MonitorHandle:
    """Call `fn(phase, step, epoch, info)` on every phase transition.

    Without `nitro` the monitor is module-level: each handle copies it at its next
    entry point, including handles already built. With `nitro` it joins that handle's
    own registry and takes effect at once.

    Args:
        fn: the monitor; `step` and `epoch` are None until the first epoch begins,
            `info` is a `PhaseInfo`.
        nitro: a handle, for the per-handle form.

    Returns:
        The handle `unregister_phase_monitor` takes.
    """
    if getattr(fn, "phase_recorder", None) is not None and callable(nitro):
        raise TypeError(
            "register_phase_monitor takes the monitor first: write "
            "register_phase_monitor(f, nitro=nitro), not register_phase_monitor("
            "nitro, f) (the spec's Julia order)."
        )
    _check_monitor(fn)
    registry = _MODULE if nitro is None else registry_of(nitro)
    return registry.add(fn)


def unregister_phase_monitor(handle: MonitorHandle) -> None:
    """Remove a monitor by its handle; removing one twice is a no-op.

    Removing a module-level monitor leaves the handles that already copied it alone.
    """
    if not isinstance(handle, MonitorHandle):
        raise TypeError(
            f"unregister_phase_monitor takes the handle register_phase_monitor "
            f"returned, not a {type(handle).__name__}: keep h = "
            f"register_phase_monitor(f) and pass h."
        )
    handle.registry.remove(handle)


def _check_monitor(fn: Any) -> None:
    if not callable(fn):
        raise TypeError(
            f"A phase monitor must be callable as f(phase, step, epoch, info); got "
            f"{type(fn).__name__} {fn!r}."
        )
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have no signature: trust them
        return
    try:
        signature.bind(None, None, None, None)
    except TypeError:
        raise TypeError(
            f"Phase monitor {_name(fn)} has the signature {signature}, which cannot "
            f"be called with the four arguments (phase, step, epoch, info). Define "
            f"it as def {_name(fn)}(phase, step, epoch, info): ..."
        ) from None


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)
