"""`compile_view` and the other whole-experiment operations the framework needs.

Only views reach a trace: every Host field is a `StrippedHost` sentinel, GraphConst
fields bake, and Device fields pass through as traced inputs. These functions work on
any experiment, derived from `Experiment` or written by hand with the three traits.
"""

from __future__ import annotations

import copy
import difflib
import math
import numbers
from typing import Any

from ..errors import ConfigError
from .stripped import StrippedHost
from .traits import field_names, graphconst_fields, host_fields


def replace_fields(e: Any, **changes: Any) -> Any:
    """A copy of `e` with fields replaced, bypassing the constructor and its checks."""
    new = copy.copy(e)
    for name, value in changes.items():
        object.__setattr__(new, name, value)
    return new


def compile_view(e: Any) -> Any:
    """The experiment as traced code sees it: every Host field a `StrippedHost`.

    Examples:
        >>> from jaxnitro import Experiment, GraphConst
        >>> class E(Experiment):
        ...     width: GraphConst[int] = 128
        ...     images: list = None
        >>> v = compile_view(E(images=[1, 2, 3]))
        >>> v.width, v.images
        (128, StrippedHost('images'))
    """
    owner = type(e).__name__
    return replace_fields(
        e, **{name: StrippedHost(name, owner) for name in host_fields(type(e))}
    )


def graphconst_values(e: Any) -> tuple[tuple[str, Any], ...]:
    """The GraphConst fields and their values: the experiment's part of a cache key."""
    return tuple((name, getattr(e, name)) for name in graphconst_fields(type(e)))


GRAPHCONST_UNHASHABLE = """\
GraphConst field `{field}` of {owner} holds a {kind} ({value}) that does not {what}.
The compile cache is keyed on GraphConst values, so a value must hash and compare by
content: two equal constructions must key the same, and a value mutated in place must
not reuse a program compiled for its old contents. {reason}
Fix: flatten it into separate fields (one knob per field), or use a tuple or a frozen
dataclass of hashable values; an array that changes between runs should be Device."""


def graphconst_record(e: Any) -> dict[str, Any]:
    """The GraphConst values as JSON data, as a checkpoint records them."""
    return {name: _as_json(value) for name, value in graphconst_values(e)}


def _as_json(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_as_json(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return repr(float(value))  # "nan", "inf": equal to itself, strict JSON
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return repr(value)


def isequal(a: Any, b: Any) -> bool:
    """`a == b`, except that a NaN equals a NaN (Julia's `isequal`), also inside
    tuples and lists.

    Examples:
        >>> nan = float("nan")
        >>> isequal(nan, float("nan")), isequal((1, nan), (1, nan)), nan == nan
        (True, True, False)
    """
    if isinstance(a, tuple | list) and isinstance(b, tuple | list):
        return (
            type(a) is type(b)
            and len(a) == len(b)
            and all(isequal(x, y) for x, y in zip(a, b, strict=True))
        )
    if bool(a == b):
        return True
    return _is_nan(a) and _is_nan(b)


def _is_nan(value: Any) -> bool:
    return isinstance(value, numbers.Number) and bool(value != value)


def assert_graphconst_hashable(e: Any) -> None:
    """Refuse a GraphConst value that does not hash and compare by content.

    The check: the value and a deep copy of it must hash equal and compare equal,
    where a NaN equals a NaN (as the cache key, `typed_key`, already has it).
    """
    for name, value in graphconst_values(e):
        kind = type(value).__name__
        shown = _short(value)
        try:
            twin = copy.deepcopy(value)
            same_hash = hash(value) == hash(twin)
        except TypeError as error:
            raise ConfigError(
                GRAPHCONST_UNHASHABLE.format(
                    field=name,
                    owner=type(e).__name__,
                    kind=kind,
                    value=shown,
                    what="hash",
                    reason=f"hash() raised: {error}.",
                )
            ) from None
        try:
            same_value = isequal(value, twin)
        except Exception as error:  # an array inside: ambiguous truth value
            same_value = False
            reason = f"Comparing it with a copy raised: {error}."
        else:
            reason = (
                "It does not compare equal to a copy of itself."
                if same_hash
                else "Its hash falls back to object identity."
            )
        if not (same_hash and same_value):
            raise ConfigError(
                GRAPHCONST_UNHASHABLE.format(
                    field=name,
                    owner=type(e).__name__,
                    kind=kind,
                    value=shown,
                    what="hash and compare by content",
                    reason=reason,
                )
            )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_field_names(cls: type, names: Any, what: str, fix: str) -> None:
    """Refuse keys that name no field of `cls`, listing the fields there are."""
    known = field_names(cls)
    unknown = [name for name in names if name not in known]
    if unknown:
        near = [
            f"`{n}` -> {', '.join(f'`{c}`' for c in close)}"
            for n in unknown
            if (close := difflib.get_close_matches(str(n), known, n=3))
        ]
        nearest = f" Nearest names: {'; '.join(near)}." if near else ""
        raise ConfigError(
            f"{what} {', '.join(f'`{n}`' for n in unknown)} "
            f"{'is not a field' if len(unknown) == 1 else 'are not fields'} of "
            f"{cls.__name__}.{nearest} Its fields are: {', '.join(known)}. {fix}"
        )
