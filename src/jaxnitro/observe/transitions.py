"""Phase transitions: a handle's recorded phase, and publishing changes to monitors.

A handle owns one `PhaseRecorder`. `set_phase` records a phase and publishes the
change (setting the current phase again is a no-op); `publish_phase` publishes without
recording, for Starting and Idle, which describe the process rather than the run, so
`nitro.phase` keeps how the run ended. Before a handle exists (during `Nitro(e)`),
`publish_phase(phase)` fires the module-level monitors with `nitro` and `logger` None.

Example:
    >>> class Handle:  # what a recorder reads from its owner
    ...     current_step, current_epoch, logger = 0, 0, None
    >>> h = Handle()
    >>> h.phase_recorder = PhaseRecorder(h)
    >>> seen = []
    >>> from .monitors import register_phase_monitor
    >>> _ = register_phase_monitor(lambda p, s, e, i: seen.append((p, s, e)), nitro=h)
    >>> from .phases import TrainStepping
    >>> h.current_step, h.current_epoch = 3, 1
    >>> set_phase(h, TrainStepping()), set_phase(h, TrainStepping())
    (True, False)
    >>> seen, h.phase_recorder.phase
    ([(TrainStepping(), 3, 1)], TrainStepping())
"""

from __future__ import annotations

import weakref
from typing import Any, Protocol

from ..devices.distributed import is_rank0
from .monitors import MonitorRegistry, PhaseInfo, module_registry
from .phases import Phase, Starting

_RESERVED = ("nitro", "logger", "is_rank0")


class MonitorSubject(Protocol):
    """What a recorder reads from its handle at each transition."""

    @property
    def current_step(self) -> int: ...

    @property
    def current_epoch(self) -> int: ...

    @property
    def logger(self) -> Any: ...


class PhaseRecorder:
    """A handle's phase and its monitors.

    The owner is held weakly, so a recorder never keeps a handle (and its device
    buffers) alive through a reference cycle.

    Attributes:
        monitors: the handle's registry (copies of module-level monitors, then its own).
    """

    def __init__(self, owner: MonitorSubject, *, initial: Phase | None = None) -> None:
        self._owner = weakref.ref(owner)
        self.monitors = MonitorRegistry()
        self._phase: Phase = Starting() if initial is None else initial
        self._pending: dict[str, Any] = {}  # info for the next published transition

    @property
    def phase(self) -> Phase:
        """The last recorded phase (Starting until the first transition)."""
        return self._phase

    def set(self, phase: Phase, **info: Any) -> bool:
        """Record `phase` and publish it; False (and nothing published) if current.

        Keywords join the monitors' info: `metrics=` on the transition out of
        EvalStepping.
        """
        _check_phase(phase, "set_phase")
        if phase == self._phase:
            return False
        self._phase = phase
        self.publish(phase, **info)
        return True

    def enter(self, phase: Phase, **info: Any) -> None:
        """Record `phase` and publish it, even when it is the current phase: an
        event that repeats within a phase (the start of each training epoch)."""
        if not self.set(phase, **info):
            self.publish(phase, **info)

    def restore(self, phase: Phase, **info: Any) -> None:
        """Go back to `phase` without publishing it (after an evaluation or a compile
        outside training, or one that failed): the handle again reports how its run
        stands, which monitors have seen already. `info` (the metrics of an
        evaluation) rides on the next published transition instead, the entry
        point's Idle for a standalone call."""
        _check_phase(phase, "restore")
        self._phase = phase
        self._pending = dict(info)

    def publish(self, phase: Phase, **info: Any) -> None:
        """Fire the monitors for `phase` without recording it."""
        _check_phase(phase, "publish_phase")
        if self._pending:
            info, self._pending = {**self._pending, **info}, {}
        step, epoch, full = self.context(**info)
        self.monitors.publish(phase, step, epoch, full)

    def context(self, **info: Any) -> tuple[int | None, int | None, PhaseInfo]:
        """`(step, epoch, info)` as monitors get them now.

        step and epoch are None until the first epoch begins (epoch 0).
        """
        _check_info(info)
        owner = self._owner()
        if owner is None:  # the handle is gone; only a late thread can see this
            return None, None, PhaseInfo(is_rank0=is_rank0(), **info)
        epoch = int(owner.current_epoch)
        step = int(owner.current_step) if epoch > 0 else None
        full = PhaseInfo(nitro=owner, logger=owner.logger, is_rank0=is_rank0(), **info)
        return step, epoch if epoch > 0 else None, full

    def __repr__(self) -> str:
        return f"PhaseRecorder({self._phase!r}, {self.monitors!r})"


def recorder_of(nitro: Any) -> PhaseRecorder:
    """The recorder of a handle (its `phase_recorder`), or `nitro` if it is one."""
    recorder = getattr(nitro, "phase_recorder", nitro)
    if not isinstance(recorder, PhaseRecorder):
        raise TypeError(
            f"Expected a Nitro or a PhaseRecorder; got {type(nitro).__name__}, which "
            f"has no `phase_recorder`. A handle creates its recorder in __init__ as "
            f"self.phase_recorder = PhaseRecorder(self)."
        )
    return recorder


def set_phase(nitro: Any, phase: Phase, **info: Any) -> bool:
    """Record `phase` on the handle and publish it; a repeat is a no-op (False)."""
    return recorder_of(nitro).set(phase, **info)


def publish_phase(phase: Phase, nitro: Any = None, **info: Any) -> None:
    """Fire monitors for `phase` without recording it.

    With `nitro`, the handle's monitors; without, the module-level ones with step,
    epoch, `info.nitro` and `info.logger` None (while `Nitro(e)` has no handle yet).
    """
    if nitro is not None:
        recorder_of(nitro).publish(phase, **info)
        return
    _check_phase(phase, "publish_phase")
    _check_info(info)
    module_registry().publish(phase, None, None, PhaseInfo(is_rank0=is_rank0(), **info))


def _check_phase(phase: Any, verb: str) -> None:
    if not isinstance(phase, Phase):
        raise TypeError(
            f"{verb} takes a phase instance such as TrainStepping(); got "
            f"{phase!r}. Instantiate the class: {verb}(..., "
            f"{getattr(phase, '__name__', 'Phase')}())."
        )


def _check_info(info: dict[str, Any]) -> None:
    clash = [key for key in _RESERVED if key in info]
    if clash:
        raise TypeError(
            f"Phase info key `{clash[0]}` is reserved: the framework fills "
            f"{', '.join(_RESERVED)} itself. Pass your value under another name."
        )
