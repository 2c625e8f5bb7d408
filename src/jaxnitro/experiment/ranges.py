"""Declared field ranges: `field(ge=..., le=...)`, checked when an experiment is built.

A field may declare the smallest and largest number it takes. The bounds are checked
in the experiment's constructor (so every construction, a preset and the agent tools'
overrides included, refuses a value out of range before any run starts), and they
show in `config_metadata()` as `FieldMeta.ge` / `FieldMeta.le`.

    >>> from jaxnitro import Experiment, GraphConst, field
    >>> class E(Experiment):
    ...     width: GraphConst[int] = field(default=8, ge=1)
    >>> E(width=0)
    Traceback (most recent call last):
    ...
    jaxnitro.errors.ConfigError: E.width must be >= 1, got 0: ...
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import jax
import numpy as np

from ..errors import ConfigError

OUT_OF_RANGE = (
    "{owner}.{field} must be {bound}, got {value!r}: the field declares "
    "{declared}. Pass a value in that range, e.g. {field}={example}."
)
NOT_A_NUMBER = (
    "{owner}.{field} declares a range ({declared}) and so takes a number, got "
    "{value!r} (a {kind}). Pass a number in that range, e.g. {field}={example}."
)
BAD_BOUNDS = (
    "field(ge={ge!r}, le={le!r}): {problem}. Pass real numbers with ge <= le, e.g. "
    "field(default=8, ge=1)."
)


def check_bounds(ge: Any, le: Any) -> tuple[float | None, float | None]:
    """`(ge, le)` checked: each None or a finite real number, and ge <= le.

    Raises:
        ConfigError: a bound is not a finite real number, or ge > le.
    """
    for bound in (ge, le):
        if bound is None:
            continue
        if not _is_real(bound) or not math.isfinite(bound):
            raise ConfigError(
                BAD_BOUNDS.format(
                    ge=ge, le=le, problem=f"{bound!r} is not a finite real number"
                )
            )
    if ge is not None and le is not None and ge > le:
        raise ConfigError(BAD_BOUNDS.format(ge=ge, le=le, problem="ge > le"))
    return ge, le


def check_in_range(owner: str, name: str, meta: Any, value: Any) -> None:
    """Refuse `value` for field `name` of class `owner` outside `meta.ge..meta.le`.

    A traced or device array is let through (a Device field inside a compiled
    program); any other value that is not a real number is refused.

    Raises:
        ConfigError: the value is not a real number, or lies outside the range.
    """
    if isinstance(value, jax.Array | np.ndarray) and not _is_real(value):
        return
    declared = describe_range(meta.ge, meta.le)
    example = _example(meta.ge, meta.le)
    if not _is_real(value) or math.isnan(float(value)):
        raise ConfigError(
            NOT_A_NUMBER.format(
                owner=owner,
                field=name,
                declared=declared,
                value=value,
                kind=type(value).__name__,
                example=example,
            )
        )
    if meta.ge is not None and value < meta.ge:
        bound = f">= {meta.ge}"
    elif meta.le is not None and value > meta.le:
        bound = f"<= {meta.le}"
    else:
        return
    raise ConfigError(
        OUT_OF_RANGE.format(
            owner=owner,
            field=name,
            bound=bound,
            value=value,
            declared=declared,
            example=example,
        )
    )


def describe_range(ge: Any, le: Any) -> str:
    """The range as words: "ge=1", "le=0.5" or "ge=0, le=1"."""
    parts = [f"{n}={b}" for n, b in (("ge", ge), ("le", le)) if b is not None]
    return ", ".join(parts)


def _example(ge: Any, le: Any) -> Any:
    return ge if ge is not None else le


def _is_real(value: Any) -> bool:
    """A real number: an int, float or NumPy real scalar, never a bool."""
    if isinstance(value, bool | np.bool_):
        return False
    if isinstance(value, np.ndarray):
        return value.ndim == 0 and value.dtype.kind in "iuf"
    return isinstance(value, numbers.Real)
