"""How logged host values become a backend's types: scalars, flat params, JSON, text.

The loop passes metrics as host values: Python numbers, NumPy scalars and arrays, and
whatever else an experiment's `finalize_metrics` returns. A backend with a scalar
series type (TensorBoard, MLflow) draws the scalars and records the rest as text or
JSON; a `MetricHistory` makes the scalars its columns.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np

_NUMERIC_KINDS = ("b", "i", "u", "f")


def as_scalar(value: Any) -> tuple[bool, Any]:
    """`(True, python_value)` for a real scalar (or None), else `(False, value)`.

    NumPy scalars and 0-d arrays become Python `bool`, `int` or `float`.

    Examples:
        >>> import numpy as np
        >>> as_scalar(np.float32(0.5)), as_scalar(np.array(3)), as_scalar([1, 2])
        ((True, 0.5), (True, 3), (False, [1, 2]))
    """
    if value is None or type(value) in (bool, int, float):
        return True, value
    if isinstance(value, numbers.Integral):
        return True, int(value)
    if isinstance(value, numbers.Real):
        return True, float(value)
    dtype = getattr(value, "dtype", None)
    if getattr(value, "shape", None) == () and getattr(dtype, "kind", None) in (
        _NUMERIC_KINDS
    ):
        return True, np.asarray(value).item()
    return False, value


def flatten(params: Mapping[str, Any], sep: str = "/") -> dict[str, Any]:
    """Nested mappings and namedtuples (a metric group's result, say) joined into one
    level with `sep`; a plain tuple is a value and stays one.

    Examples:
        >>> flatten({"lr": 0.1, "adam": {"b1": 0.9}, "shape": (2, 3)})
        {'lr': 0.1, 'adam/b1': 0.9, 'shape': (2, 3)}
    """
    flat: dict[str, Any] = {}
    for key, value in params.items():
        fields = getattr(type(value), "_fields", None)
        if isinstance(value, tuple) and fields is not None:  # a namedtuple
            value = dict(zip(fields, value, strict=True))
        if isinstance(value, Mapping):
            for inner, leaf in flatten(value, sep).items():
                flat[f"{key}{sep}{inner}"] = leaf
        else:
            flat[str(key)] = value
    return flat


def jsonable(value: Any) -> Any:
    """`value` as strict JSON-ready data: arrays become lists, unknown objects their
    repr, and a NaN or infinity becomes None (null), since JSON has no token for it.

    Examples:
        >>> import numpy as np
        >>> jsonable({"m": np.eye(2, dtype=int), "x": np.float32(0.5)})
        {'m': [[1, 0], [0, 1]], 'x': 0.5}
        >>> jsonable(np.array([1.0, np.nan]))
        [1.0, None]
    """
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray | np.generic) or hasattr(value, "__array__"):
        array = np.asarray(value)
        if array.dtype.kind in "fc" and not np.isfinite(array).all():
            return jsonable(array.tolist())  # element by element, for the nulls
        return array.item() if array.ndim == 0 else array.tolist()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, bool | int | str):
        return value
    return repr(value)


def as_text(value: Any) -> str:
    """A value as Markdown: one-line text as is, anything longer as a code block.

    Examples:
        >>> as_text("done"), as_text("a\\nb")
        ('done', '    a\\n    b')
    """
    text = value if isinstance(value, str) else repr(jsonable(value))
    if "\n" not in text:
        return text
    return "\n".join("    " + line for line in text.splitlines())


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table.

    Examples:
        >>> print(markdown_table(["k", "v"], [["lr", 0.1]]))
        | k | v |
        |---|---|
        | lr | 0.1 |
    """
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
