"""`nitro_predict` inputs checked against what the handle's `forward` reads.

A handle's setup probed one batch of its data and recorded, for each field, the
per-sample shape and dtype (`Prepared.routing`). A client's inputs are compared with
that before the model sees them: a field `forward` does not declare, a required one
missing, rows of another shape (15 columns where the model reads 8) or fractions for
an integer field are refused naming the field, what was sent and what the model
takes; integers for a float field are converted, as JSON carries no dtype.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import ConfigError

UNKNOWN_FIELD = (
    "predict inputs[{field!r}]: forward reads no field {field!r}; it reads "
    "{fields}. Pass inputs with those field names."
)
MISSING_FIELD = (
    "predict inputs lack {field!r}, which forward requires; it reads {fields}. "
    "Add {field!r}: rows (batch axis first)."
)
WRONG_SHAPE = (
    "predict inputs[{field!r}]: each row has shape {got} ({rows} rows of {what}), "
    "but the model reads {field!r} rows of shape {want} ({dtype}). Pass rows of "
    "shape {want}, batch axis first."
)
NOT_WHOLE = (
    "predict inputs[{field!r}] holds fractions, but the model reads {field!r} as "
    "{dtype}. Pass whole numbers."
)


def checked_batch(batch: Mapping[str, np.ndarray], handle: Any) -> dict[str, Any]:
    """`batch` checked against `handle`'s forward fields, in their recorded dtypes.

    A handle whose setup saw no batch (no data) records no shapes; its fields are
    then checked by name only.

    Raises:
        ConfigError: an unknown or missing field, a row shape other than the one
            recorded, a batch axis missing, or fractions for an integer field.
    """
    routing = handle.prepared.routing
    forward = routing.fields["forward"]
    declared = tuple(forward.required) + tuple(forward.optional)
    shown = ", ".join(repr(n) for n in declared) or "no fields"
    if not forward.takes_all:
        for field in batch:
            if field not in declared:
                raise ConfigError(UNKNOWN_FIELD.format(field=field, fields=shown))
    for field in forward.required:
        if field not in batch:
            raise ConfigError(MISSING_FIELD.format(field=field, fields=shown))
    checked: dict[str, Any] = {}
    for field, array in batch.items():
        want = routing.sample_shapes.get(field)
        dtype = routing.sample_dtypes.get(field)
        if array.ndim == 0 or (
            want is not None and tuple(array.shape[1:]) != tuple(want)
        ):
            raise ConfigError(
                WRONG_SHAPE.format(
                    field=field,
                    got=tuple(array.shape[1:]) if array.ndim else "()",
                    rows=array.shape[0] if array.ndim else 0,
                    what=_what(array),
                    want=tuple(want) if want is not None else "(...)",
                    dtype=dtype or "any dtype",
                )
            )
        checked[field] = _in_dtype(field, array, dtype)
    return checked


def _in_dtype(field: str, array: np.ndarray, dtype: str | None) -> np.ndarray:
    """`array` converted to the recorded `dtype` when that keeps its values."""
    try:
        target = np.dtype(dtype) if dtype is not None else None
    except TypeError:
        target = None
    if target is None or target == array.dtype:
        return array
    lossless = target.kind not in "iu" or array.dtype.kind != "f"
    if not lossless and not np.all(np.mod(array, 1) == 0):
        raise ConfigError(NOT_WHOLE.format(field=field, dtype=target))
    if target.kind in "iufb":
        return array.astype(target)
    return array


def _what(array: np.ndarray) -> str:
    if array.ndim <= 1:
        return "scalars"
    if array.ndim == 2:
        return f"{array.shape[1]} values"
    return f"shape {tuple(array.shape[1:])}"
