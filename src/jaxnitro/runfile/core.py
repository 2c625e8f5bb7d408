"""The core names every run file sees without a `require`.

Arithmetic `+ - * /`, comparison `= < > <= >=`, `not`, `min`, `max`, `list`,
`slice`, `reshape`, `cast`, `concat`, and the declarations of data and selection
(`loader`, `files`, `field`, `select`, `group`). Arithmetic works on numbers and,
inside `prepare` and the objective, on arrays.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from functools import reduce
from typing import Any

from .bounds import check_result
from .source import RunfileError, Span, did_you_mean, fail
from .values import Builtin, kind_of, show


def invoke(
    function: Builtin, values: list[Any], kwargs: dict[str, Any], span: Span
) -> Any:
    """Call a builtin after checking its arity and its required keywords."""
    low, high = function.arity
    if len(values) < low or (high is not None and len(values) > high):
        wanted = (
            f"{low}"
            if low == high
            else (f"at least {low}" if high is None else f"{low} to {high}")
        )
        raise fail(
            "E-EVAL-004",
            f"`{function.name}` takes {wanted} positional "
            f"argument(s), got {len(values)}",
            span,
            function.doc or None,
        )
    missing = [k for k in function.required if k not in kwargs]
    if missing:
        raise fail(
            "E-EVAL-006",
            f"`{function.name}` needs " + ", ".join(f":{k}" for k in missing),
            span,
            f"add {' '.join(f':{k} ...' for k in missing)}",
        )
    try:
        return function.impl(values, kwargs, span)
    except RunfileError:
        raise
    except ZeroDivisionError:
        raise fail(
            "E-EVAL-014", f"division by zero in `{function.name}`", span
        ) from None
    except TypeError as error:
        raise fail(
            "E-EVAL-007",
            f"`{function.name}` cannot take these values: "
            f"{', '.join(show(v) for v in values)} ({error})",
            span,
        ) from None


def check_keyword(
    function: Builtin, name: str, seen: dict[str, Any], span: Span
) -> None:
    """Refuse a keyword `function` does not accept, or one given twice."""
    if name in seen:
        raise fail(
            "E-EVAL-005",
            f"`:{name}` is given twice to `{function.name}`",
            span,
            "remove one",
        )
    if function.keywords is not None and name not in function.keywords:
        accepted = " ".join(f":{k}" for k in function.keywords) or "none"
        near = did_you_mean(name, function.keywords)
        raise fail(
            "E-EVAL-005",
            f"`{function.name}` has no keyword `:{name}` (it takes {accepted})",
            span,
            near and near.replace("`", "`:", 1),
        )


def expect(
    value: Any, types: type | tuple[type, ...], what: str, span: Span, wanted: str
) -> Any:
    """`value` when of `types` (a bool is no number), else E-EVAL-007."""
    ok = isinstance(value, types) and not (
        isinstance(value, bool) and bool not in _tuple(types)
    )
    if not ok:
        raise fail(
            "E-EVAL-007",
            f"{what} must be {wanted}, got {kind_of(value)} {show(value)}",
            span,
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise fail(
            "E-EVAL-007",
            f"{what} must be a finite number, got {show(value)}",
            span,
            f"give {what} a finite value",
        )
    return value


def _tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


def _arith(name: str, op: Callable[[Any, Any], Any], unit: Any) -> Builtin:
    def impl(values: list[Any], kwargs: dict[str, Any], span: Span) -> Any:
        for v in values:
            if isinstance(v, bool) or v is None or isinstance(v, str | tuple):
                raise fail(
                    "E-EVAL-007",
                    f"`{name}` works on numbers and arrays, got {kind_of(v)} {show(v)}",
                    span,
                )
        if name == "-" and len(values) == 1:
            return check_result(-values[0], name, span)
        if name == "/" and len(values) == 1:
            return check_result(1.0 / values[0], name, span)
        try:
            result = reduce(op, values[1:], values[0]) if values else unit
        except OverflowError:  # an integer too large for a float's range
            result = math.inf
        return check_result(result, name, span)

    return Builtin(
        name, impl, (0 if unit is not None else 1, None), (), doc=f"({name} a b ...)"
    )


def _compare(name: str, op: Callable[[Any, Any], bool]) -> Builtin:
    def impl(values: list[Any], kwargs: dict[str, Any], span: Span) -> bool:
        return all(op(a, b) for a, b in zip(values, values[1:], strict=False))

    return Builtin(name, impl, (2, None), (), doc=f"({name} a b ...)")


def _list(values: list[Any], kwargs: dict[str, Any], span: Span) -> tuple[Any, ...]:
    return tuple(values)


def _not(values: list[Any], kwargs: dict[str, Any], span: Span) -> bool:
    return values[0] is None or values[0] is False


def _slice(values: list[Any], kwargs: dict[str, Any], span: Span) -> Any:
    import jax

    array, axis, start, stop = values
    for index, (what, v) in enumerate(
        (("axis", axis), ("start", start), ("stop", stop)), 1
    ):
        expect(v, int, f"the {what} of `slice`", span.at(index), "an integer")
    if not hasattr(array, "shape"):
        raise fail(
            "E-EVAL-007", f"`slice` takes an array, got {kind_of(array)}", span.at(0)
        )
    rank = len(array.shape)
    if not -rank <= axis < rank or not 0 <= start <= stop <= array.shape[axis]:
        raise fail(
            "E-SHAPE-004",
            f"(slice x {axis} {start} {stop}) is outside an "
            f"array of shape {list(array.shape)}",
            span,
            f"axis is below {rank}; start <= stop <= the axis length",
        )
    return jax.lax.slice_in_dim(array, start, stop, axis=axis)


def core_names() -> dict[str, Any]:
    """The names bound in every run file before its first form."""
    from . import curriculum, stdlib_data, stdlib_optim, tensors

    names: dict[str, Any] = {
        "+": _arith("+", operator.add, 0),
        "-": _arith("-", operator.sub, None),
        "*": _arith("*", operator.mul, 1),
        "/": _arith("/", operator.truediv, None),
        "min": _arith("min", min, None),
        "max": _arith("max", max, None),
        "=": _compare("=", operator.eq),
        "<": _compare("<", operator.lt),
        ">": _compare(">", operator.gt),
        "<=": _compare("<=", operator.le),
        ">=": _compare(">=", operator.ge),
        "not": Builtin("not", _not, (1, 1), (), doc="(not x)"),
        "list": Builtin("list", _list, (0, None), None, doc="(list a b ...)"),
        "slice": Builtin(
            "slice", _slice, (4, 4), (), doc="(slice array axis start stop)"
        ),
    }
    names.update(tensors.names())
    names.update(stdlib_data.names())
    names.update(stdlib_optim.core_names())
    names.update(curriculum.names())
    return names
