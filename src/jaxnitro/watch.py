"""The watched validation metric: which one a component follows, and its value.

`EarlyStopping`, `Plateau` and the checkpointer each watch one metric of the
validation results. `follow_monitor` fills an unset metric or mode from the run's
`monitor`, `check_mode` refuses a mode other than "min" or "max", and `read_watched`
reads the metric out of one epoch's results, refusing a missing or non-finite value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .errors import CheckpointError, ConfigError


def check_control_readback(value: Any, what: str, name: str) -> float:
    """A scalar the framework branches on, validated: finite and real, or raise."""
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


def read_watched(
    metrics: Mapping[str, Any],
    metric: str,
    what: str,
    *,
    error: type[Exception],
    watcher: str,
    hint: str = "",
) -> float:
    """`metrics[metric]`, validated by `check_control_readback` (as "the `what`").

    A missing metric raises `error`: "<watcher>, but validation returned <names>."
    followed by `hint`.
    """
    if metric not in metrics:
        raise error(
            f"{watcher}, but validation returned {', '.join(metrics) or 'no metrics'}."
            f"{hint}"
        )
    return check_control_readback(metrics[metric], what, metric)


def check_mode(mode: str | None, owner: str) -> None:
    """Refuse `owner(mode=...)` other than None, "min" or "max"."""
    if mode is not None and mode not in ("min", "max"):
        raise ConfigError(f'{owner}(mode={mode!r}): mode must be "min" or "max".')


def follow_monitor(
    metric: str | None,
    mode: str | None,
    monitor: tuple[str, str] | None,
    *,
    owner: str,
    spelled: str,
) -> tuple[str, str]:
    """`metric` and `mode`, each filled from `monitor` where unset.

    With either unset and no monitor, raises ConfigError naming `owner` and how to
    pass both (`spelled`, e.g. "EarlyStopping(metric=..., mode=...)").
    """
    if metric is not None and mode is not None:
        return metric, mode
    if monitor is None:
        raise ConfigError(
            f"{owner} has no metric to watch: set monitor() on the experiment, or "
            f"pass {spelled}."
        )
    return metric or monitor[0], mode or monitor[1]
