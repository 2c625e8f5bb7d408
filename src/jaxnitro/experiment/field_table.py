"""An experiment's fields as text: the marker table and each value's short display.

A subclass's docstring gains `marker_table(cls)` (field, kind, type, default, doc),
so `help(MyExp)` shows every field at a glance; `summarize` is how a field value
shows there, in the experiment's repr and in the logged parameters: never a device
buffer, never a big array.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import jax
import numpy as np

from .traits import NO_DEFAULT


def summarize(value: Any) -> str:
    """A short display of a field value: never a device buffer, never a big array."""
    if isinstance(value, jax.Array):
        shape = "x".join(map(str, value.shape))
        if value.ndim == 0 and not isinstance(value, jax.core.Tracer):
            return f"{value.dtype}[] on device"
        return f"{value.dtype}[{shape}] on device"
    if isinstance(value, np.ndarray):
        if value.size <= 8 and value.ndim <= 1:
            return repr(value.tolist())
        return f"{value.dtype}[{'x'.join(map(str, value.shape))}]"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


_KIND_NAMES = {"graphconst": "GraphConst", "device": "Device", "host": "Host"}


def marker_table(cls: type) -> str:
    """The fields as an aligned text table (field, kind, type, default, doc)."""
    rows: list[tuple[str, ...]] = [("field", "kind", "type", "default", "doc")]
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        meta = cls._jaxnitro_meta[f.name]  # type: ignore[attr-defined]
        if f.default_factory is not dataclasses.MISSING:
            default = "<factory>"
        elif meta.default is NO_DEFAULT:
            default = "required"
        else:
            default = summarize(meta.default)
        rows.append(
            (
                f.name,
                _KIND_NAMES.get(meta.kind, meta.kind),
                _type_name(meta.type),
                default if len(default) <= 24 else default[:21] + "...",
                " ".join((meta.doc or "").split()),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    rows.insert(1, tuple("-" * w for w in widths) + ("-" * 3,))
    lines = [
        "    "
        + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False))
        + "  "
        + row[4]
        for row in rows
    ]
    return f"Fields of {cls.__name__}:\n\n" + "\n".join(line.rstrip() for line in lines)


def _type_name(annotation: Any) -> str:
    if annotation is None or annotation is typing.Any:
        return "Any"
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")
