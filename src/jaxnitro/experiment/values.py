"""Conversions of field values: GraphConst normalization and Device placement.

A GraphConst value must hash and compare by content, because the compile cache is keyed
on it; lists become tuples here, and a value converts to its declared type without loss
or is refused. A Device value becomes a `jax.Array` with the declared dtype (`float` is
float32) when a `Nitro` is set up, and `set_device` converts a new value the same way,
refusing one that would change the compiled program's signature or wrap around.
"""

from __future__ import annotations

import numbers
from typing import Any

import jax
import numpy as np

from ..errors import ConfigError

_PYTHON_DTYPES: dict[Any, Any] = {
    float: np.float32,
    int: np.int32,
    bool: np.bool_,
    complex: np.complex64,
}
_NARROW = {
    np.dtype(np.float64): np.dtype(np.float32),
    np.dtype(np.int64): np.dtype(np.int32),
    np.dtype(np.uint64): np.dtype(np.uint32),
    np.dtype(np.complex128): np.dtype(np.complex64),
}


def freeze_graphconst(value: Any) -> Any:
    """Lists become tuples, recursively, so a GraphConst value hashes by content."""
    if isinstance(value, list | tuple):
        frozen = tuple(freeze_graphconst(item) for item in value)
        return frozen if type(value) in (list, tuple) else type(value)(*frozen)
    return value


GRAPHCONST_TYPE = """\
GraphConst field `{field}` is declared {declared} but got {value!r} ({kind}), which \
does not convert to {declared} without loss. A GraphConst field holds its declared \
type; numbers convert among bool, int and float only when the value is kept, and \
nothing converts from or to a string. Fix: pass {fix}."""

_GRAPHCONST_FIXES = {
    bool: "True or False (parse a string such as 'False' before passing it)",
    int: "an integer",
    float: "a number",
    complex: "a number",
    str: "a string",
    tuple: "a tuple (a list converts to one)",
}
_REFUSED: Any = object()


def coerce_graphconst(name: str, declared: Any, value: Any) -> Any:
    """Convert a GraphConst value to its declared type, refusing a lossy conversion.

    Lists become tuples first. A number converts to a declared bool, int, float or
    complex when the conversion keeps its value (3.0 -> 3, np.int64(2) -> 2, 1 ->
    True), a NumPy string to `str`; anything else of another type is refused. A
    declared type other than these, or none, is left to the value.

    Examples:
        >>> coerce_graphconst("depth", int, 3.0), coerce_graphconst("p", float, 1)
        (3, 1.0)
    """
    value = freeze_graphconst(value)
    if not (isinstance(declared, type) and declared in _GRAPHCONST_FIXES):
        return value
    converted = _convert(declared, value)
    if converted is _REFUSED:
        raise ConfigError(
            GRAPHCONST_TYPE.format(
                field=name,
                declared=declared.__name__,
                value=value,
                kind=type(value).__name__,
                fix=_GRAPHCONST_FIXES[declared],
            )
        )
    return converted


def _convert(declared: type, value: Any) -> Any:
    """`value` as a `declared`, or `_REFUSED` when that would change it."""
    if declared is str:
        return str(value) if isinstance(value, str) else _REFUSED
    if declared is tuple:
        return value if isinstance(value, tuple) else _REFUSED
    # np.bool_ is no numbers.Number; a complex keeps its value only as a complex.
    real = isinstance(value, numbers.Real | np.bool_)
    if not (real or (declared is complex and isinstance(value, numbers.Complex))):
        return _REFUSED
    try:
        converted = declared(value)
    except (ValueError, OverflowError):  # int(nan), int(inf)
        return _REFUSED
    same = converted == value or (converted != converted and value != value)  # NaN
    return converted if same else _REFUSED


def device_dtype(declared: Any, value: Any) -> np.dtype:
    """The dtype a Device field lives in: the declared one, else the value's, narrowed.

    JAX runs in 32-bit unless x64 is enabled, so 64-bit host values narrow to 32 bits.
    """
    if declared in _PYTHON_DTYPES:
        return np.dtype(_PYTHON_DTYPES[declared])
    try:
        if declared is not None and isinstance(declared, type | np.dtype):
            dtype = np.dtype(declared)
            if dtype.kind in "biufc":
                return dtype
    except TypeError:
        pass
    dtype = np.asarray(value).dtype if not isinstance(value, jax.Array) else value.dtype
    if not jax.config.values.get("jax_enable_x64", False):
        dtype = _NARROW.get(np.dtype(dtype), np.dtype(dtype))
    return np.dtype(dtype)


def to_host_array(name: str, dtype: np.dtype, value: Any) -> np.ndarray:
    """Convert `value` to a host array of `dtype`, refusing one that does not fit."""
    if isinstance(value, jax.Array):
        value = np.asarray(value)
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as error:
        raise ConfigError(
            f"Device field `{name}` holds {dtype} values; {value!r} does not convert "
            f"to an array ({error})."
        ) from None
    if array.dtype.kind not in "biufc":
        raise ConfigError(
            f"Device field `{name}` holds {dtype} values; {value!r} "
            f"({type(value).__name__}) is not numeric. Pass a number or a numeric "
            f"array."
        )
    integral = np.all(np.isfinite(array)) and np.all(array == np.round(array))
    if dtype.kind in "iu" and array.dtype.kind == "f" and not integral:
        raise ConfigError(
            f"Device field `{name}` holds {dtype} values; {value!r} is not "
            f"integral and would be truncated. Pass an integer."
        )
    if dtype.kind == "b" and array.dtype.kind != "b":
        raise ConfigError(
            f"Device field `{name}` holds bool values; got {value!r}. Pass True or "
            f"False."
        )
    if dtype.kind in "biuf" and array.dtype.kind == "c":
        raise ConfigError(
            f"Device field `{name}` holds {dtype} values; {value!r} is complex."
        )
    if dtype.kind in "iu" and array.dtype.kind in "iuf" and array.size:
        # astype wraps an integer that does not fit around, silently: 2**40 -> 0.
        bounds = np.iinfo(dtype)
        low, high = array.min(), array.max()
        if low < bounds.min or high > bounds.max:
            shown = f"{value!r}" if array.size == 1 else f"values from {low} to {high}"
            raise ConfigError(
                f"Device field `{name}` holds {dtype} values, from {bounds.min} to "
                f"{bounds.max}; got {shown}, out of that range, which the conversion "
                f"would wrap around. Pass values in range."
            )
    return array.astype(dtype)


def to_device(name: str, declared: Any, value: Any) -> jax.Array:
    """Place a Device field's host value on the device with its declared dtype."""
    dtype = device_dtype(declared, value)
    # device_put, not jnp.asarray: on a NumPy array the latter compiles an XLA
    # program per shape and dtype before the first step.
    return jax.device_put(to_host_array(name, dtype, value))


def to_host_value(value: Any) -> Any:
    """A device value read back: a Python scalar for a 0-d array, else a NumPy array.

    A float narrower than Python's comes back as the shortest decimal that reads
    back as the same value of its dtype: float32 0.05 is 0.05, not
    0.05000000074505806, in a log line or a report.

    >>> to_host_value(np.float32(0.05)), to_host_value(np.int32(3))
    (0.05, 3)
    """
    array = np.asarray(value)
    if array.ndim:
        return array
    if array.dtype.kind == "f" and array.dtype.itemsize < 8:
        return float(str(array))
    return array.item()
