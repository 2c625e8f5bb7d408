"""The array functions `prepare` uses beside `slice` and arithmetic: `reshape`,
`cast` and `concat`. Each works on traced arrays (inside `prepare`, the objective
and `evaluate`) and refuses a shape or dtype it cannot honour with a coded error.
"""

from __future__ import annotations

import math
from typing import Any

from .source import Span, fail
from .values import Builtin, Keyword, kind_of, show


def _array(value: Any, what: str, span: Span) -> Any:
    if not hasattr(value, "shape") or not hasattr(value, "dtype"):
        raise fail("E-EVAL-007", f"{what} takes an array, got {kind_of(value)}", span)
    return value


def _reshape(values: list[Any], kwargs: dict[str, Any], span: Span) -> Any:
    array = _array(values[0], "`reshape`", span.at(0))
    shape = values[1]
    if not isinstance(shape, tuple) or not all(
        isinstance(n, int) and not isinstance(n, bool) and (n >= 1 or n == -1)
        for n in shape
    ):
        raise fail(
            "E-EVAL-007",
            f"the shape of `reshape` is a vector of positive integers (one may be "
            f"-1), got {show(shape)}",
            span.at(1),
            "(reshape x [4 -1])",
        )
    known = math.prod(n for n in shape if n != -1)
    size = math.prod(array.shape)
    fits = (size % known == 0) if -1 in shape else size == known
    if shape.count(-1) > 1 or not fits:
        raise fail(
            "E-SHAPE-009",
            f"(reshape x {show(shape)}) cannot hold the {size} elements of an "
            f"array of shape {list(array.shape)}",
            span,
            "the new shape must hold as many elements (at most one -1)",
        )
    return array.reshape(shape)


def _cast(values: list[Any], kwargs: dict[str, Any], span: Span) -> Any:
    from .stdlib_data import DTYPES

    array = _array(values[0], "`cast`", span.at(0))
    dtype = values[1]
    if not isinstance(dtype, Keyword) or dtype.name not in DTYPES:
        raise fail(
            "E-LOAD-004",
            f"unknown dtype {show(dtype)} of `cast`",
            span.at(1),
            "one of " + " ".join(f":{d}" for d in DTYPES),
        )
    return array.astype(DTYPES[dtype.name])


def _concat(values: list[Any], kwargs: dict[str, Any], span: Span) -> Any:
    import jax.numpy as jnp

    arrays, axis = values
    if not isinstance(arrays, tuple) or not arrays:
        raise fail(
            "E-EVAL-007",
            f"`concat` takes a vector of arrays, got {kind_of(arrays)}",
            span.at(0),
            "(concat [a b] 1)",
        )
    for a in arrays:
        _array(a, "`concat`", span.at(0))
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise fail(
            "E-EVAL-007",
            f"the axis of `concat` is an integer, got {show(axis)}",
            span.at(1),
        )
    rank = len(arrays[0].shape)
    shapes = [list(a.shape) for a in arrays]
    agree = -rank <= axis < rank and all(len(s) == rank for s in shapes)
    if agree:
        at = axis % rank
        agree = len({tuple(s[:at] + s[at + 1 :]) for s in shapes}) == 1
    if not agree:
        raise fail(
            "E-SHAPE-010",
            f"(concat [...] {axis}) of arrays of shapes {shapes}",
            span,
            "the arrays must have one rank and agree on every axis but `axis`",
        )
    return jnp.concatenate(arrays, axis=axis)


def names() -> dict[str, Builtin]:
    """`reshape`, `cast` and `concat`, bound in every run file."""
    return {
        "reshape": Builtin("reshape", _reshape, (2, 2), (), doc="(reshape x [4 -1])"),
        "cast": Builtin("cast", _cast, (2, 2), (), doc="(cast x :f32)"),
        "concat": Builtin("concat", _concat, (2, 2), (), doc="(concat [a b] axis)"),
    }
