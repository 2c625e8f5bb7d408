"""The three traits every experiment class carries, for any class.

`Experiment` subclasses get them from the base class. A class that does not derive from
`Experiment` defines them itself (as class methods or plain class attributes), which is
the spec's escape hatch for an experiment written without the base:

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Handwritten:
        width: int = 32
        smoothing: float = 0.1
        max_epochs: int = 1

        device_fields = ("smoothing",)
        host_fields = ("max_epochs",)

        def build_model(self, rng): ...

Fields named in neither trait are GraphConst.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..watch import did_you_mean
from .markers import Kind


class _NoDefault:
    def __repr__(self) -> str:
        return "NO_DEFAULT"


NO_DEFAULT: Any = _NoDefault()
"""The `default` of a required field in `config_metadata`."""


@dataclass(frozen=True)
class FieldMeta:
    """One field's entry in `config_metadata`.

    Attributes:
        type: the declared type inside the marker (`None` when unknown).
        default: the declared default, or `NO_DEFAULT` for a required field.
        kind: "graphconst", "device" or "host".
        doc: the attribute docstring or `field(doc=...)`, else `None`.
        line: the source line of the declaration, 0 when unknown.
        ge: the smallest value the field takes (`field(ge=...)`), else None.
        le: the largest value the field takes (`field(le=...)`), else None.
    """

    type: Any
    default: Any
    kind: str
    doc: str | None
    line: int
    ge: float | None = None
    le: float | None = None


def _read_trait(cls: type, name: str) -> Any:
    value = getattr(cls, name, None)
    if value is None:
        return None
    return value() if callable(value) else value


def device_fields(cls: type) -> tuple[str, ...]:
    """The names of `cls`'s Device fields, in declaration order."""
    value = _read_trait(cls, "device_fields")
    return tuple(value) if value is not None else ()


def host_fields(cls: type) -> tuple[str, ...]:
    """The names of `cls`'s Host fields (unmarked ones too), in declaration order."""
    value = _read_trait(cls, "host_fields")
    return tuple(value) if value is not None else ()


def field_names(cls: type) -> tuple[str, ...]:
    """Every configuration field of `cls`, in declaration order."""
    meta = _read_trait(cls, "config_metadata")
    if meta:
        return tuple(meta)
    if dataclasses.is_dataclass(cls):
        return tuple(f.name for f in dataclasses.fields(cls))
    return tuple(getattr(cls, "__annotations__", {}))


def graphconst_fields(cls: type) -> tuple[str, ...]:
    """The GraphConst fields: every field that is neither Device nor Host."""
    other = set(device_fields(cls)) | set(host_fields(cls))
    return tuple(name for name in field_names(cls) if name not in other)


def field_kind_of(cls: type, name: str) -> Kind:
    """The marker kind of field `name` of `cls`."""
    if name in device_fields(cls):
        return Kind.DEVICE
    if name in host_fields(cls):
        return Kind.HOST
    return Kind.GRAPHCONST


def config_metadata(cls: type) -> dict[str, FieldMeta]:
    """One `FieldMeta` per field of `cls`, in declaration order.

    A hand-written class that defines no `config_metadata` of its own gets entries
    synthesized from its fields and traits, with no docs, line 0 and no defaults.
    """
    meta = _read_trait(cls, "config_metadata")
    if meta:
        return dict(meta)
    types = getattr(cls, "__annotations__", {})
    return {
        name: FieldMeta(
            type=types.get(name),
            default=NO_DEFAULT,
            kind=field_kind_of(cls, name).value,
            doc=None,
            line=0,
        )
        for name in field_names(cls)
    }


def dispatch_variant(
    experiment: Any, field: str, *, choices: tuple[Any, ...] | None = None
) -> Any:
    """The value of a variant selector field, checked to fold at trace time.

    A hook that branches on a field (`build_model` picking an architecture,
    `forward` a head) must branch on a value fixed when the program is traced: a
    GraphConst field, which is part of the compile-cache key, so each variant is
    its own program; or a Host field outside traced hooks. A Device field is a
    traced input, whose value is unknown while tracing, so it is refused here
    rather than failing inside `jax.jit` with a tracer-conversion error.

    Args:
        experiment: the experiment (`self` in a hook).
        field: the selector field's name.
        choices: the values the hook implements; another value is refused with
            the list, naming the field.

    Returns:
        The field's value, to branch or look up a builder on.

    Raises:
        ConfigError: no such field (with the near names), a Device field, or a
            value outside `choices`.

    Examples:
        >>> import jaxnitro as nx
        >>> class E(nx.Experiment):
        ...     model_kind: nx.GraphConst[str] = "mlp"
        >>> builders = {"mlp": "an MLP", "cnn": "a CNN"}
        >>> builders[nx.dispatch_variant(E(), "model_kind", choices=tuple(builders))]
        'an MLP'
    """
    cls = type(experiment)
    names = field_names(cls)
    if field not in names:
        raise ConfigError(
            f"dispatch_variant: {cls.__name__} has no field {field!r}."
            f"{did_you_mean(field, names)}"
        )
    if field in device_fields(cls):
        raise ConfigError(
            f"dispatch_variant: {cls.__name__}.{field} is a Device field, a traced "
            f"input whose value is unknown while the program is traced, so it "
            f"cannot pick a branch. Mark it GraphConst (each value compiles its own "
            f"program), or select with jnp.where/jax.lax.switch on the traced value."
        )
    value = getattr(experiment, field)
    if choices is not None and value not in choices:
        raise ConfigError(
            f"dispatch_variant: {cls.__name__}.{field}={value!r} is not one of the "
            f"variants this hook implements: {', '.join(map(repr, choices))}."
        )
    return value
