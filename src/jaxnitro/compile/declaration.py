"""`Program`: one compiled program, declared once, and where it is looked up.

Every program a run compiles (the train program, `eval_forward`, `eval_metrics`,
`eval_loss`) is declared by a `Program` (`kinds.py`): its kind, the typed tuple of
its arguments, its builder, the hooks it traces (their code is in its key), the host
constants it bakes in, the arguments it donates and how they are laid out on a mesh,
both by the argument's field name. `Program.executable` finds it in the handle's
memo (`executables.py`) or the module's compile cache (`cache.py`), compiling it
once. Both keys follow from the declaration's one `key` (its kind, traced hooks,
baked constants, donation and layout): the memo pairs it with the per-call shapes
the caller names; the cache key (`TraceContext.key`) adds the code fingerprint of
the traced hooks and the arguments' signature. So a new baked constant goes in one
place, the declaration, and reaches both keys.

    >>> from typing import NamedTuple
    >>> class Args(NamedTuple):
    ...     outputs: object
    ...     weights: object
    >>> program = Program(
    ...     "demo", Args, lambda: None, traced=("loss",), donate=("weights",)
    ... )
    >>> program.argnums
    (1,)
    >>> program.memo(((8, 10),))[0][:2]
    ('demo', ('loss',))
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..devices.placement import Role
from ..errors import NitroError
from ..keys.program_key import typed_key
from .cache import program_cache
from .executables import Executables
from .programs import Placed, TraceContext

NOT_A_FIELD = (
    "Program {kind!r} names {name!r} in its {where}, but its arguments ({args}) have "
    "no such field; they are {fields}. Name a field of {args}."
)
NOT_ITS_ARGS = (
    "Program {kind!r} takes its arguments as {args}; it was given {given}. Build "
    "them as {args}(...)."
)


class Like(NamedTuple):
    """A result laid out as the argument `field` went in (the donated state comes
    back where it was)."""

    field: str


@dataclass(frozen=True)
class Layout:
    """Where a program's arguments and results go on a mesh, by argument name.

    Attributes:
        inputs: the role of each argument named here; the others are replicated.
        outputs: each result's role, or `Like(field)` to keep that argument's
            layout; None leaves the results' layout to XLA (eval outputs, sliced
            on the host).
    """

    inputs: Mapping[str, Role] = field(default_factory=dict)
    outputs: tuple[Role | Like, ...] | None = None

    def positions(self, fields: tuple[str, ...], where: Callable[[str], int]) -> Placed:
        """The layout by argument position, for the arguments `fields`; `where`
        gives a name's position (or raises naming it)."""
        for name in self.inputs:
            where(name)
        inputs = tuple(self.inputs.get(name, "replicated") for name in fields)
        if self.outputs is None:
            return inputs, None
        outputs = tuple(
            where(role.field) if isinstance(role, Like) else role
            for role in self.outputs
        )
        return inputs, outputs


REPLICATED = Layout(outputs=("replicated",))
"""Every argument and the one result replicated."""


@dataclass(frozen=True)
class Program:
    """One program kind's declaration.

    Attributes:
        kind: the program's name (its compile phase, its cache key's kind).
        args: the NamedTuple of its arguments; the caller builds one and the
            executable is called with its fields in order (`executable(*args)`).
        build: the builder of the traced function, called only on a compile
            (`Program.executable` passes it the caller's builder arguments).
        traced: the hooks it traces; their code fingerprints key it.
        baked: the host constants it captures that its arguments do not carry
            (a mode, the fields, the optimizer's constants); keys both.
        donate: the arguments whose buffers it consumes, by field name.
        layout: where each argument and result goes on a mesh (`Layout`),
            by field name; None: every argument and result replicated.
        announce_as: the compile phase it shows (default: `kind`).
        argnums: `donate` by position (derived).
        placed: `layout` by position (derived).
        key: what both keys hold of the declaration (derived).
    """

    kind: str
    args: type[Any]  # a NamedTuple class
    build: Callable[..., Callable[..., Any]]
    traced: tuple[str, ...]
    baked: Mapping[str, Any] = field(default_factory=dict)
    donate: tuple[str, ...] = ()
    layout: Layout | None = None
    announce_as: str | None = None
    argnums: tuple[int, ...] = field(init=False, repr=False, compare=False)
    placed: Placed = field(init=False, repr=False, compare=False)
    key: Hashable = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        fields: tuple[str, ...] = self.args._fields

        def where(part: str) -> Callable[[str], int]:
            def position(name: str) -> int:
                if name not in fields:
                    raise NitroError(
                        NOT_A_FIELD.format(
                            kind=self.kind,
                            name=name,
                            where=part,
                            args=self.args.__name__,
                            fields=", ".join(fields),
                        )
                    )
                return fields.index(name)

            return position

        argnums = tuple(map(where("donate"), self.donate))
        layout = self.layout or Layout(outputs=None)
        placed = layout.positions(fields, where("layout"))
        constants = {**self.baked, "donate": argnums, "roles": placed}
        key = (
            self.kind,
            self.traced,
            tuple(sorted((k, typed_key(v)) for k, v in constants.items())),
        )
        object.__setattr__(self, "argnums", argnums)
        object.__setattr__(self, "placed", placed)
        object.__setattr__(self, "key", key)

    def constants(self) -> dict[str, Any]:
        """The host constants the program captures: its baked ones, its donation
        and its layout by position (the cache key's `baked` holds them)."""
        return {**self.baked, "donate": self.argnums, "roles": self.placed}

    def running(
        self,
        baked: Mapping[str, Any],
        *,
        traced: tuple[str, ...] | None = None,
        layout: Layout | None = None,
    ) -> Program:
        """This kind as one run compiles it: `baked` added to the declaration's
        constants, and the traced hooks and layout replaced where given."""
        return Program(
            self.kind,
            self.args,
            self.build,
            self.traced if traced is None else traced,
            {**self.baked, **baked},
            self.donate,
            self.layout if layout is None else layout,
            self.announce_as,
        )

    def memo(self, varying: Hashable) -> Hashable:
        """The handle's memo key beside the kind (`Executables.get` pairs them):
        the declaration's `key` and what varies per call (`varying`: the shapes the
        caller names)."""
        return (self.key, varying)

    def executable(
        self,
        executables: Executables,
        ctx: TraceContext,
        args: tuple[Any, ...],
        varying: Hashable,
        *build_args: Any,
        **build_options: Any,
    ) -> Any:
        """The compiled program for `args` (an `self.args` tuple): the handle's, or
        the cache's, or compiled now from `self.build(*build_args,
        **build_options)` (called only then: building a traced function can
        cost)."""
        if type(args) is not self.args:
            raise NitroError(
                NOT_ITS_ARGS.format(
                    kind=self.kind,
                    args=self.args.__name__,
                    given=f"a {type(args).__name__}",
                )
            )
        announce = executables.announcer()
        phase = self.announce_as or self.kind
        return executables.get(
            self.kind,
            self.memo(varying),
            lambda: ctx.compile(
                program_cache(),
                self,
                self.build(*build_args, **build_options),
                args,
                on_compile=lambda _kind: announce(phase),
            ),
        )
