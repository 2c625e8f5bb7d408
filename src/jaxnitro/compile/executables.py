"""`Executables`: one handle's compiled programs, and the compile phases they announce.

The module cache (`cache.py`) shares programs between handles; this memo saves a
handle the key computation on every later call: a program is looked up in the cache
once per handle and memo (its kind and what its key depends on here, such as the
batch shapes). A real compile publishes its phase (TrainCompiling, EvalCompiling,
...) and shows it on the progress line; when it ends the phase the run was in is
back, so a monitor sees compile -> stepping, and a failed compile leaves no compile
phase announced.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Any, Protocol

from ..observe import phases


class PhaseOwner(Protocol):
    """What the memo needs of the handle it serves: its phase and progress line."""

    @property
    def phase(self) -> phases.Phase: ...

    def set_phase(self, phase: phases.Phase) -> None: ...

    def restore_phase(self, phase: phases.Phase) -> None: ...

    def progress(self) -> Any: ...


class Executables:
    """The executables one handle has looked up, by `(kind, memo)`.

    Example::

        step = nitro.executables.get("train_step", memo, lambda: ctx.compile(...))

    A program reaches it through its declaration, `Program.executable`
    (`declaration.py`), which derives the memo from the declaration's key (the
    one the compile cache's key holds too) and the per-call shapes.
    """

    def __init__(self, owner: PhaseOwner) -> None:
        self._owner = owner
        self._found: dict[tuple[str, Hashable], Any] = {}
        self._timings: dict[tuple[str, Hashable], tuple[float, bool]] = {}
        self._checked: set[Hashable] = set()

    def get(self, kind: str, memo: Hashable, build: Callable[[], Any]) -> Any:
        """The executable for `(kind, memo)`, built through `build` once."""
        key = (kind, memo)
        found = self._found.get(key)
        if found is None:
            owner = self._owner
            before = owner.phase
            started = time.perf_counter()
            try:
                found = build()
            except BaseException:
                owner.restore_phase(before)  # no compile stays announced
                raise
            self._found[key] = found
            # A real compile announced its phase; a cache hit announced none.
            compiled = owner.phase != before
            self._timings[key] = (time.perf_counter() - started, compiled)
            if compiled:
                owner.set_phase(before)
                bar = owner.progress()
                if bar is not None:
                    bar.phase("")
        return found

    def compiled(self) -> list[tuple[str, Any]]:
        """`(kind, executable)` for every program this handle has looked up, in the
        order it first needed them."""
        return [(kind, found) for (kind, _memo), found in self._found.items()]

    def timings(self) -> list[tuple[str, float, bool]]:
        """`(kind, seconds, compiled)` for every program this handle has looked up,
        in the order of `compiled()`: the seconds the lookup took (tracing,
        lowering and XLA's compile on a miss; the key alone on a hit), and
        whether it compiled (False: the module cache served it)."""
        return [
            (kind, *self._timings.get((kind, memo), (0.0, False)))
            for (kind, memo) in self._found
        ]

    def check_once(self, check: Hashable, run: Callable[[], None]) -> None:
        """Run `run`, a check of a program's outputs worth doing on its first call
        only, until it passes once for `check`."""
        if check not in self._checked:
            run()
            self._checked.add(check)

    def announcer(self) -> Callable[[str], None]:
        """The compile callback: publish the compile phase, show it on the line."""
        owner = self._owner

        def announce(kind: str) -> None:
            phase = phases.compile_phase(kind)
            bar = owner.progress()
            if bar is not None:  # the line first, so a monitor's view matches it
                bar.phase(phase.label)
            owner.set_phase(phase)

        return announce
