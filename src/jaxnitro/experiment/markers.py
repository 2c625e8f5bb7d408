"""The three field markers: `GraphConst[T]`, `Device[T]` and `Host[T]`.

A marker is a `typing.Annotated` alias, so a type checker sees the plain `T` while the
framework reads the kind back from the annotation. An unmarked field is Host.

    class MyExp(jaxnitro.Experiment):
        width: GraphConst[int] = 128     # bakes into the graph; changing it recompiles
        smoothing: Device[float] = 0.05  # a traced input; sweep it without recompiling
        max_epochs: int = 20             # unmarked, so Host: the tracer never sees it
"""

from __future__ import annotations

import enum
import re
import typing
from dataclasses import dataclass
from typing import Annotated, Any, TypeAlias, TypeVar

T = TypeVar("T")


class Kind(enum.Enum):
    """What a field is to the compiler."""

    GRAPHCONST = "graphconst"
    DEVICE = "device"
    HOST = "host"


@dataclass(frozen=True)
class _Marker:
    kind: Kind

    def __repr__(self) -> str:
        return f"<jaxnitro {self.kind.value} marker>"


GRAPHCONST_MARKER = _Marker(Kind.GRAPHCONST)
DEVICE_MARKER = _Marker(Kind.DEVICE)
HOST_MARKER = _Marker(Kind.HOST)

GraphConst: TypeAlias = Annotated[T, GRAPHCONST_MARKER]
"""A structural field: a trace-time constant and part of the compile cache key."""

Device: TypeAlias = Annotated[T, DEVICE_MARKER]
"""A traced input: placed on the device at setup, sweepable without recompiling."""

Host: TypeAlias = Annotated[T, HOST_MARKER]
"""A driver-only field (the default): never converted, hashed or traced."""


@dataclass(frozen=True)
class FieldKind:
    """A field's marker kind and the type inside the marker (`None` when unknown)."""

    kind: Kind
    inner: Any


_STRING_MARKER = re.compile(r"^\s*(?:[\w.]+\.)?(GraphConst|Device|Host)\[(.*)\]\s*$")
_STRING_KINDS = {
    "GraphConst": Kind.GRAPHCONST,
    "Device": Kind.DEVICE,
    "Host": Kind.HOST,
}
_STRING_TYPES: dict[str, Any] = {
    "int": int,
    "float": float,
    "bool": bool,
    "str": str,
    "complex": complex,
}


def field_kind(annotation: Any) -> FieldKind:
    """Read the marker kind from a resolved annotation or, failing that, its string."""
    if isinstance(annotation, str):
        return _kind_from_string(annotation)
    if typing.get_origin(annotation) is Annotated:
        inner, *extras = typing.get_args(annotation)
        for extra in extras:
            if isinstance(extra, _Marker):
                return FieldKind(extra.kind, inner)
        return FieldKind(Kind.HOST, inner)
    return FieldKind(Kind.HOST, annotation)


def _kind_from_string(text: str) -> FieldKind:
    match = _STRING_MARKER.match(text)
    if match is None:
        return FieldKind(Kind.HOST, _STRING_TYPES.get(text.strip()))
    kind = _STRING_KINDS[match.group(1)]
    return FieldKind(kind, _STRING_TYPES.get(match.group(2).strip()))
