"""How each run setting's value is checked and converted (`RunConfig`'s checks).

One check per setting, `check(value, source)`: it returns the value as its field's
type (a value already of that type kept as given, so the binding report shows what
was passed; a NumPy integer, a `Path` run_dir or 1 for a switch converted as the run
always read it) or raises a `ConfigError` naming the setting, the value, where it
came from (`source`: "keyword", "method", "field", "default", ...) and the fix.
`SETTING_CHECKS` holds them in the order a construction reports the first bad value.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Literal

import numpy as np

from ..checkpoint.checkpointer import Checkpointer
from ..compile.precision import check_precision
from ..devices.placement import check_sharding
from ..devices.process import check_n_devs
from ..errors import ConfigError
from ..observe.profiling import check_profile
from ..optim.setup import check_ema
from .setup_checks import check_compile_options, check_monitor

INT_REQUIRED = (
    "{name} must be an int, got {value!r} (from the {source}). Pass a whole number, "
    "e.g. {name}=4."
)
NUMBER_REQUIRED = (
    "{name} must be a number, got {value!r} (from the {source}). Pass a float, e.g. "
    "{name}=1.0; 0 turns clipping off."
)
SEED_RANGE = (
    "seed={value} (from the {source}) is out of range: jax.random.key takes a seed "
    "from -2**63 to 2**63 - 1. Pass a smaller whole number, e.g. seed % 2**32 = "
    "{suggested}."
)
RUN_DIR_TYPE = (
    "run_dir must be a path (a str or an os.PathLike), got {value!r} (from the "
    '{source}). Pass a directory, e.g. run_dir="runs/mnist"; to write nothing, '
    "pass checkpointer=None and logger=None and leave run_dir at its default."
)
RUN_DIR_EMPTY = (
    "run_dir is an empty string (from the {source}), which would scatter "
    "checkpoints and logs in the working directory unnoticed. Pass a directory, e.g. "
    'run_dir="runs/mnist", or run_dir="." to mean the working directory.'
)
RUN_DIR_FILE = (
    "run_dir={value!r} (from the {source}) is an existing file, not a directory; "
    "the run writes its checkpoints and log inside run_dir. Pass a directory path, "
    "or move the file away."
)
CHECKPOINTER_TYPE = "checkpointer must be a Checkpointer or None, got {kind}."


def _counter(name: str, *, low: int) -> Callable[[Any, str], int]:
    """A count the run's arithmetic depends on: a true int, at least `low`."""

    def check(value: Any, source: str) -> int:
        if not isinstance(value, int | np.integer) or isinstance(value, bool):
            raise ConfigError(
                INT_REQUIRED.format(name=name, value=value, source=source)
            )
        if value < low:
            raise ConfigError(
                f"{name} must be >= {low}, got {value} (from the {source})."
            )
        return value if isinstance(value, int) else int(value)

    return check


def _optional_counter(name: str) -> Callable[[Any, str], int | None]:
    """A step count that may be off: None, or a true int >= 1."""
    count = _counter(name, low=1)

    def check(value: Any, source: str) -> int | None:
        return None if value is None else count(value, source)

    return check


def _whole(name: str) -> Callable[[Any, str], int]:
    """An int as the run always read it: `int(value)`, so 3.0 is 3."""

    def check(value: Any, source: str) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ConfigError(
                INT_REQUIRED.format(name=name, value=value, source=source)
            ) from None

    return check


_SEED_LOW, _SEED_HIGH = -(2**63), 2**63 - 1  # what jax.random.key accepts


def _check_seed(value: Any, source: str) -> int:
    """A whole number in jax.random.key's range: an int, a NumPy integer, or a
    float with no fraction (3.0 is 3); never a string, a bool, 1.5 or inf."""
    whole: int | None = None
    if isinstance(value, int | np.integer) and not isinstance(value, bool):
        whole = int(value)
    elif isinstance(value, float | np.floating) and math.isfinite(value):
        whole = int(value) if float(value).is_integer() else None
    if whole is None:
        raise ConfigError(INT_REQUIRED.format(name="seed", value=value, source=source))
    if not _SEED_LOW <= whole <= _SEED_HIGH:
        raise ConfigError(
            SEED_RANGE.format(value=whole, source=source, suggested=whole % 2**32)
        )
    return value if isinstance(value, int) else whole


def _check_run_dir(value: Any, source: str) -> str:
    """A path to a directory, existing or not: not None, a number or "", nor an
    existing regular file."""
    path = os.fspath(value) if isinstance(value, os.PathLike) else value
    if not isinstance(path, str):
        raise ConfigError(RUN_DIR_TYPE.format(value=value, source=source))
    if not path:
        raise ConfigError(RUN_DIR_EMPTY.format(source=source))
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(RUN_DIR_FILE.format(value=path, source=source))
    return path


def _check_n_devs(value: Any, source: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value == 1:
        return value  # one device: nothing to check against the visible ones
    return check_n_devs(value, f"Nitro(...) (n_devs from the {source}):")


def _check_clip(value: Any, source: str) -> float:
    # An int is kept as given (it is a valid float), so the report shows the 1 passed.
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    try:
        if isinstance(value, str | bytes):  # "1.0" is not a number: a typo's sign
            raise TypeError(value)
        return float(value)
    except (TypeError, ValueError):
        raise ConfigError(
            NUMBER_REQUIRED.format(
                name="gradient_clip_norm", value=value, source=source
            )
        ) from None


def _check_monitor(value: Any, source: str) -> tuple[str, str] | None:
    return None if value is None else check_monitor(value)


def _check_checkpointer(value: Any, source: str) -> Checkpointer | None:
    if value is not None and not isinstance(value, Checkpointer):
        raise ConfigError(CHECKPOINTER_TYPE.format(kind=type(value).__name__))
    return value


STEPS_PER_CALL_VALUE = (
    'steps_per_call must be a whole number >= 1 or "auto", got {value!r} (from the '
    '{source}). Pass e.g. steps_per_call=8, or "auto" to pick it from the measured '
    "step time."
)


def _check_steps_per_call(value: Any, source: str) -> int | Literal["auto"]:
    """A count of steps per dispatch, or "auto" (`loop.call_count.steps_per_call`)."""
    if isinstance(value, str) and value == "auto":
        return "auto"
    if not isinstance(value, int | np.integer) or isinstance(value, bool):
        raise ConfigError(STEPS_PER_CALL_VALUE.format(value=value, source=source))
    return _counter("steps_per_call", low=1)(value, source)


def _check_options(value: Any, source: str) -> Mapping[str, bool | int | float | str]:
    return MappingProxyType(check_compile_options(value))


FLAG_REQUIRED = (
    "{name} must be True or False, got {value!r} (from the {source}). Pass "
    "{name}=True or {name}=False."
)


def _flag(name: str) -> Callable[[Any, str], bool]:
    """A switch: True or False (or the whole numbers 1 and 0), never a value that
    only reads as one (None would have turned check_divergence off unnoticed)."""

    def check(value: Any, source: str) -> bool:
        if isinstance(value, bool | np.bool_) or (
            isinstance(value, int | np.integer) and value in (0, 1)
        ):
            return bool(value)
        raise ConfigError(FLAG_REQUIRED.format(name=name, value=value, source=source))

    return check


# Each field's check, in the order a construction reports the first bad value: the
# counts, n_devs and the monitor first, as setup always checked them.
SETTING_CHECKS: dict[str, Callable[[Any, str], Any]] = {
    "accum": _counter("accum", low=1),
    "max_epochs": _counter("max_epochs", low=0),
    "max_steps": _optional_counter("max_steps"),
    "log_every_n_steps": _counter("log_every_n_steps", low=1),
    "val_every_n_steps": _optional_counter("val_every_n_steps"),
    "checkpoint_every_n_steps": _optional_counter("checkpoint_every_n_steps"),
    "n_devs": _check_n_devs,
    "monitor": _check_monitor,
    "seed": _check_seed,
    "run_dir": _check_run_dir,
    "gradient_clip_norm": _check_clip,
    "check_divergence": _flag("check_divergence"),
    "autolog_schedules": _flag("autolog_schedules"),
    "eval_loss": _flag("eval_loss"),
    "checkpointer": _check_checkpointer,
    "compile_options": _check_options,
    "sharding": check_sharding,
    "ema": lambda value, source: check_ema(value),
    "restore_optimizer": _flag("restore_optimizer"),
    "resume_changed_data": _flag("resume_changed_data"),
    "load_ema": _flag("load_ema"),
    "profile": lambda value, source: check_profile(value),
    "precision": lambda value, source: check_precision(value),
    "steps_per_call": _check_steps_per_call,
}
