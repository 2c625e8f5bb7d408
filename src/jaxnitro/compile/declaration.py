"""`Program`: one compiled program, declared once, and where it is looked up.

Every program a run compiles (the train program, `eval_forward`, `eval_metrics`,
`eval_loss`) is declared by a `Program`: its kind, the hooks it traces (their code
is in its key), the host constants it bakes in, the arguments it donates and how
they are laid out on a mesh. `Program.executable` finds it in the handle's memo
(`executables.py`) or the module's compile cache (`cache.py`), compiling it once:
both keys follow from the declaration (the memo from its kind, its baked constants
and the per-call shapes the caller names; the cache key from the same kind, baked
constants and hooks, plus the code fingerprint and the arguments' signature,
`TraceContext.key`). So a new baked constant goes in one place, the declaration,
and reaches both keys.

    >>> program = Program("eval_loss", traced=("loss",), baked={"mode": "eval"})
    >>> program.memo(((8, 10),))
    ((('mode', "'eval'"),), ((8, 10),))
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .cache import program_cache
from .executables import Executables
from .programs import Layout, TraceContext


@dataclass(frozen=True)
class Program:
    """One program kind's declaration.

    Attributes:
        kind: the program's name (its compile phase, its cache key's kind).
        traced: the hooks it traces; their code fingerprints key it.
        baked: the host constants it captures that its arguments do not carry
            (a mode, the fields, the optimizer's constants); keys both.
        donate: the arguments whose buffers it consumes, by position.
        layout: where each argument and result goes on a mesh (default: the
            kind's entry in `programs.LAYOUTS`).
        announce_as: the compile phase it shows (default: `kind`).
    """

    kind: str
    traced: tuple[str, ...]
    baked: Mapping[str, Any] = field(default_factory=dict)
    donate: tuple[int, ...] = ()
    layout: Layout | None = None
    announce_as: str | None = None

    def memo(self, varying: Hashable) -> Hashable:
        """The handle's memo key beside the kind (`Executables.get` pairs them):
        the baked constants (by their repr, as the cache key holds them) and what
        varies per call (`varying`: the shapes the caller names)."""
        baked = tuple(sorted((k, repr(v)) for k, v in self.baked.items()))
        return (baked, varying)

    def executable(
        self,
        executables: Executables,
        ctx: TraceContext,
        fn: Callable[[], Callable[..., Any]],
        args: tuple[Any, ...],
        varying: Hashable,
    ) -> Any:
        """The compiled program for `args`: the handle's, or the cache's, or
        compiled now from `fn()` (called only then: building a traced function
        can cost)."""
        announce = executables.announcer()
        phase = self.announce_as or self.kind
        return executables.get(
            self.kind,
            self.memo(varying),
            lambda: ctx.compile(
                program_cache(),
                self.kind,
                fn(),
                args,
                traced=self.traced,
                baked=dict(self.baked),
                donate=self.donate,
                on_compile=lambda _kind: announce(phase),
                layout=self.layout,
            ),
        )
