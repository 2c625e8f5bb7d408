"""The watched validation metric: which one a component follows, and its value.

`EarlyStopping`, `Plateau` and the checkpointer each watch one metric of the
validation results. `follow_monitor` fills an unset metric and mode from the run's
`monitor`, `check_mode` refuses a mode other than "min" or "max", `check_pair` a
metric without a mode or the reverse, and `read_watched` reads the metric out of one
epoch's results, refusing a missing or non-finite value. `is_unscored` is the one
rule all three share for an epoch that ranks nothing: its metric is NaN or infinite,
or its validation pass's forward outputs were (`NONFINITE_OUTPUTS` counts them).
"""

from __future__ import annotations

import difflib
import math
import numbers
from collections.abc import Iterable, Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np

from .errors import CheckpointError, ConfigError

__all__ = ["check_control_readback"]

NONFINITE_OUTPUTS = "nonfinite_outputs"
"""The key an eval pass adds to its metrics, with the count, when forward's outputs
held NaN or infinite values (absent from a clean pass)."""


def check_control_readback(value: Any, what: str, name: str) -> float:
    """A scalar the framework branches on, validated: finite and real, or raise.

    Real means a Python or NumPy real number, a bool among them (as in the spec's
    Julia, where Bool <: Real), or a 0-d array of a bool, integer or floating dtype (a
    device scalar). Text is refused even when it would parse ("0.93", b"0.5"), and so
    is a complex number, whose imaginary part float() would drop.

    Examples:
        >>> check_control_readback(0.5, "checkpoint metric", "acc")
        0.5
        >>> check_control_readback("0.93", "checkpoint metric", "acc")
        Traceback (most recent call last):
        ...
        jaxnitro.errors.CheckpointError: The checkpoint metric `acc` is '0.93', not ...
    """
    if not _is_real(value):
        raise CheckpointError(
            f"The {what} `{name}` is {value!r}, not a real number (it is a "
            f"{type(value).__name__}). Return it from metrics/finalize_metrics as a "
            f"number (a float, or a 0-d array), not text or a complex value."
        )
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise CheckpointError(
            f"The {what} `{name}` is {value!r}, not a real number."
        ) from None
    if not math.isfinite(number):
        raise CheckpointError(
            f"The {what} `{name}` is {number}; the framework will not rank or stop on "
            f"a non-finite value."
        )
    return number


def _is_real(value: Any) -> bool:
    """A real number: no text, no complex, no array but a 0-d one."""
    dtype = getattr(value, "dtype", None)
    if dtype is not None:
        try:
            kind = np.dtype(dtype).kind
        except TypeError:
            return False
        # jnp.issubdtype also knows bfloat16 and the other ml_dtypes floats.
        real = kind in "biu" or jnp.issubdtype(dtype, jnp.floating)
        return real and np.ndim(value) == 0
    return isinstance(value, numbers.Real)


def read_watched(
    metrics: Mapping[str, Any],
    metric: str,
    what: str,
    *,
    error: type[Exception],
    watcher: str,
    hint: str = "",
    non_finite_ok: bool = False,
) -> float:
    """`metrics[metric]`, validated by `check_control_readback` (as "the `what`").

    A missing metric raises `error`: "<watcher>, but validation returned <names>."
    followed by `hint`. With `non_finite_ok`, an unscored epoch (`is_unscored`)
    reads as a non-finite value: a NaN or infinite real as it is, a finite one whose
    pass had non-finite outputs as NaN (evaluation has warned of either; the caller
    counts it as no improvement).
    """
    if metric not in metrics:
        raise error(
            f"{watcher}, but validation returned {', '.join(metrics) or 'no metrics'}."
            f"{did_you_mean(metric, metrics)}{hint}"
        )
    value = metrics[metric]
    if non_finite_ok and is_unscored(metrics, metric):
        return float(value) if is_non_finite(value) else math.nan
    return check_control_readback(value, what, metric)


def is_unscored(metrics: Mapping[str, Any], metric: str) -> bool:
    """Whether one epoch's validation `metrics` rank nothing by `metric`: its value
    is NaN or infinite, or it is a real number but the pass's forward outputs held
    NaN or infinite values (`metrics[NONFINITE_OUTPUTS]` > 0), which a metric such
    as accuracy (an argmax) can hide. The checkpointer keeps such an epoch
    unscored; early stopping and Plateau count it as no improvement. A missing or
    non-real value is not unscored: `read_watched` refuses it by name.

    >>> is_unscored({"acc": float("nan")}, "acc"), is_unscored({"acc": 0.9}, "acc")
    (True, False)
    >>> is_unscored({"acc": 0.9, NONFINITE_OUTPUTS: 3}, "acc")
    True
    """
    value = metrics.get(metric)
    if is_non_finite(value):
        return True
    count = metrics.get(NONFINITE_OUTPUTS, 0)
    return _is_real(value) and _is_real(count) and count > 0


def is_non_finite(value: Any) -> bool:
    """Whether `value` is a real scalar that is NaN or infinite (text, complex values
    and arrays are not: `check_control_readback` refuses them by name).

    >>> is_non_finite(float("nan")), is_non_finite(1.0), is_non_finite("nan")
    (True, False, False)
    """
    if value is None or isinstance(value, str | bytes | complex) or np.ndim(value):
        return False
    try:
        return not math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """A message's suffix naming the known name closest to a misspelled one.

    >>> did_you_mean("accc", ["acc", "loss"])
    ' Did you mean `acc`?'
    """
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" Did you mean `{close[0]}`?" if close else ""


def check_mode(mode: str | None, owner: str) -> None:
    """Refuse `owner(mode=...)` other than None, "min" or "max"."""
    if mode is not None and mode not in ("min", "max"):
        raise ConfigError(f'{owner}(mode={mode!r}): mode must be "min" or "max".')


def check_pair(metric: str | None, mode: str | None, owner: str) -> None:
    """Refuse `owner(metric=...)` without a mode, or the reverse: filling the missing
    half from the monitor would pair a metric with another metric's direction."""
    if (metric is None) != (mode is None):
        half = (
            "a metric without its mode" if mode is None else "a mode without its metric"
        )
        raise ConfigError(
            f"{owner}(metric={metric!r}, mode={mode!r}) gives {half}; the missing "
            f"half cannot come from the monitor, which watches its own metric. Give "
            f"both to watch something other than the monitor, e.g. "
            f"{owner}(metric={metric or 'acc'!r}, mode={mode or 'max'!r}), or neither "
            f"to follow the run's monitor."
        )


def follow_monitor(
    metric: str | None,
    mode: str | None,
    monitor: tuple[str, str] | None,
    *,
    owner: str,
    spelled: str,
) -> tuple[str, str]:
    """`metric` and `mode` as given, or both from `monitor` when neither is.

    Refuses a half-given pair (see `check_pair`). With neither given and no monitor,
    raises ConfigError naming `owner` and how to pass both (`spelled`, e.g.
    "EarlyStopping(metric=..., mode=...)").
    """
    check_pair(metric, mode, owner)
    if metric is not None and mode is not None:
        return metric, mode
    if monitor is None:
        raise ConfigError(
            f"{owner} has no metric to watch: set monitor() on the experiment, or "
            f"pass {spelled}."
        )
    return monitor[0], monitor[1]
