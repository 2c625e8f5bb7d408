"""A structural key of an Optax transformation: equal keys compute alike.

An `OptState` carries its transformation as static pytree metadata, so the
transformation is part of every compiled manual step's key. Optax builds a
transformation from closures, and a function compares by identity: a
`setup_optimizers` that calls `optax.adam(1e-3)` anew for each handle would make
every new handle recompile a program it already has. The key here follows what the
transformation would compute instead: each function's code (module, name,
bytecode, constants) and, recursively, its defaults and closure cells (the
hyperparameters, the inner transformations of a chain, a schedule), and values by
content. `optax.adam(1e-3)` built twice gives one key; `optax.adam(2e-3)` another.

A user's own function (a schedule defined in the experiment's module) is keyed by
`keys.fingerprint`, which also follows the globals it reads. Anything the key
cannot describe by value (an object of an unknown class) keys by identity, so a
doubt is a cache miss, never a wrong hit.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
from collections.abc import Hashable
from typing import Any

import numpy as np

from ..keys.fingerprint import fingerprint
from ..keys.library_code import is_user_code
from ..keys.program_key import Identity

_SCALARS = (type(None), bool, int, float, complex, str, bytes)
_MAX_DEPTH = 64


def rule_key(tx: Any) -> Hashable:
    """The structural key of `tx` (see the module); cached per transformation.

    Examples:
        >>> import optax
        >>> rule_key(optax.adam(1e-3)) == rule_key(optax.adam(1e-3))
        True
        >>> rule_key(optax.adam(1e-3)) == rule_key(optax.adam(2e-3))
        False
    """
    try:
        return _cached_key(tx)
    except TypeError:  # an unhashable transformation: described afresh
        return _key(tx, set(), 0)


@functools.lru_cache(maxsize=512)
def _cached_key(tx: Any) -> Hashable:
    return _key(tx, set(), 0)


def _key(obj: Any, seen: set[int], depth: int) -> Hashable:
    if isinstance(obj, _SCALARS):
        # repr keeps -0.0 from 0.0 and a NaN equal to itself.
        return ("v", type(obj).__name__, repr(obj))
    if depth > _MAX_DEPTH or id(obj) in seen:
        return Identity(obj)
    seen = seen | {id(obj)}
    depth += 1
    if isinstance(obj, enum.Enum):
        return ("enum", type(obj).__qualname__, obj.name)
    if isinstance(obj, np.ndarray | np.generic) or _is_jax_array(obj):
        array = np.asarray(obj)
        return ("array", str(array.dtype), array.shape, array.tobytes())
    if isinstance(obj, tuple | list):
        items = tuple(_key(item, seen, depth) for item in obj)
        return ("seq", type(obj).__module__, type(obj).__qualname__, items)
    if isinstance(obj, dict):
        try:
            ordered = sorted(obj.items())
        except TypeError:
            return Identity(obj)
        return ("dict", tuple((k, _key(v, seen, depth)) for k, v in ordered))
    if isinstance(obj, functools.partial):
        return (
            "partial",
            _key(obj.func, seen, depth),
            _key(obj.args, seen, depth),
            _key(obj.keywords, seen, depth),
        )
    if isinstance(obj, types.FunctionType):
        return _function_key(obj, seen, depth)
    if isinstance(obj, types.MethodType):
        return ("method", obj.__func__.__qualname__, _key(obj.__self__, seen, depth))
    if isinstance(obj, types.BuiltinFunctionType | type) or _is_named_library(obj):
        return ("named", getattr(obj, "__module__", None), obj.__qualname__)
    if dataclasses.is_dataclass(obj):
        fields = tuple(
            (f.name, _key(getattr(obj, f.name), seen, depth))
            for f in dataclasses.fields(obj)
        )
        return ("dataclass", type(obj).__module__, type(obj).__qualname__, fields)
    return Identity(obj)


def _function_key(fn: types.FunctionType, seen: set[int], depth: int) -> Hashable:
    if is_user_code(fn):
        return ("user", fingerprint(fn))  # follows the globals it reads too
    cells = []
    for cell in fn.__closure__ or ():
        try:
            cells.append(_key(cell.cell_contents, seen, depth))
        except ValueError:  # an empty cell
            cells.append("<empty>")
    return (
        "fn",
        fn.__module__,
        fn.__qualname__,
        _code_key(fn.__code__),
        _key(fn.__defaults__, seen, depth),
        _key(fn.__kwdefaults__, seen, depth),
        tuple(cells),
    )


def _code_key(code: types.CodeType) -> Hashable:
    consts = tuple(
        _code_key(c) if isinstance(c, types.CodeType) else repr(c)
        for c in code.co_consts
    )
    return (code.co_code, consts, code.co_names)


def _is_jax_array(obj: Any) -> bool:
    module = type(obj).__module__ or ""
    return module.startswith("jax") and hasattr(obj, "dtype") and hasattr(obj, "shape")


def _is_named_library(obj: Any) -> bool:
    """A library callable named by module and qualname (a NumPy ufunc, jnp.sqrt)."""
    return (
        callable(obj)
        and isinstance(getattr(obj, "__qualname__", None), str)
        and isinstance(getattr(obj, "__module__", None), str)
        and not is_user_code(obj)
        and not hasattr(obj, "__self__")
    )
