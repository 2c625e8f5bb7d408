"""Run keywords and the accessors they default to, resolved once at construction.

Each accessor resolves as: the `Nitro` keyword, else the experiment's own method or a
field of the same name, else the default on `Experiment`. `schedules` alone reads no
field, and a field of that name is refused. Where each value came from
is kept, for the binding report and the stale-handle check.

Keywords and accessors owned by features that have not landed yet are refused when
given, rather than silently ignored: a run never trains with a setting it did not
honour.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from ..errors import ConfigError, NotYetSupportedError
from ..experiment.base import Experiment, defines
from ..experiment.traits import field_names

# Run keywords that default to the accessor of the same name.
ACCESSOR_KEYWORDS = (
    "seed",
    "run_dir",
    "n_devs",
    "accum",
    "max_epochs",
    "max_steps",
    "schedules",
    "gradient_clip_norm",
    "check_divergence",
    "autolog_schedules",
    "log_every_n_steps",
    "val_every_n_steps",
    "checkpoint_every_n_steps",
    "logger",
    "checkpointer",
    "early_stop",
    "monitor",
    "eval_loss",
    "ema",
)
# Run keywords naming a fact about this construction; no accessor.
PLAIN_KEYWORDS = (
    "data",
    "weights",
    "resume",
    "run_ref",
    "w0",
    "restore_optimizer",
    "resume_changed_data",
    "restore_best",
    "eval_weights",
    "load_ema",
    "compile_options",
    "sharding",
    "preset",
    "profile",
    "precision",
    "smoke",
    "steps_per_call",
)
RUN_KEYWORDS = ACCESSOR_KEYWORDS + PLAIN_KEYWORDS

# Scalar accessors the stale-handle check compares (never the ones that construct).
SCALAR_ACCESSORS = (
    "seed",
    "run_dir",
    "n_devs",
    "accum",
    "max_epochs",
    "max_steps",
    "gradient_clip_norm",
    "check_divergence",
    "autolog_schedules",
    "log_every_n_steps",
    "val_every_n_steps",
    "checkpoint_every_n_steps",
    "eval_loss",
    "monitor",
)

# Hooks whose behaviour arrives with a later feature; overriding one is refused.
_LATER_HOOKS: dict[str, str] = {}
# Keywords (and accessor values) that arrive later: refused unless left at the default.
_LATER_VALUES: dict[str, tuple[Any, str]] = {}


# Where a run value came from; "record" is a value a resume adopted from its record,
# "smoke" one a smoke run set, "environment" a setting read from the environment,
# "pin" the process's `setup_devices(n_devs=...)`; "max_steps" the epoch count a
# max_steps run needs (max_epochs left at its default).
Source = Literal[
    "keyword",
    "pin",
    "method",
    "field",
    "default",
    "record",
    "smoke",
    "environment",
    "max_steps",
]
SOURCES: tuple[Source, ...] = get_args(Source)


@dataclass(frozen=True)
class Resolved:
    """One accessor's value and where it came from."""

    value: Any
    source: Source  # "keyword", "method", "field" or "default"


# `schedules` reads no field of the experiment (the spec): its entries are functions
# of the step, not configuration values. A field of that name would shadow the method
# and be ignored, so it is refused.
SCHEDULES_FIELD = (
    "{cls} has a field `schedules`, but the schedules accessor reads no field of the "
    "experiment: schedules are functions of the step, not configuration values. "
    "Rename the field and define a method, `def schedules(self): return {{...}}`, or "
    "pass Nitro(..., schedules={{...}}) for one run."
)


def _refuse_schedules_field(cls: type, name: str) -> None:
    if name == "schedules" and name in field_names(cls):
        raise ConfigError(SCHEDULES_FIELD.format(cls=cls.__name__))


def accessor_value(e: Any, name: str, cls: type | None = None) -> Resolved:
    """The accessor `name` of `e`: a field, a method of `cls`, or the default."""
    cls = cls or type(e)
    _refuse_schedules_field(cls, name)
    if name in field_names(cls):
        return Resolved(getattr(e, name), "field")
    if defines(cls, name):
        attr = getattr(cls, name)
        return Resolved(attr(e) if callable(attr) else attr, "method")
    return Resolved(getattr(Experiment, name)(e), "default")


def resolve(e: Any, name: str, keywords: Mapping[str, Any]) -> Resolved:
    """Keyword beats the experiment's method or field, which beats the default."""
    # Refused under a keyword too: the field would be ignored either way.
    _refuse_schedules_field(type(e), name)
    if name in keywords:
        return Resolved(keywords[name], "keyword")
    return accessor_value(e, name)


def refuse_later_features(e: Any, keywords: Mapping[str, Any]) -> None:
    """Refuse hooks and keywords whose feature has not landed yet."""
    cls = type(e)
    for hook, feature in _LATER_HOOKS.items():
        if defines(cls, hook) or hook in field_names(cls):
            raise NotYetSupportedError(
                f"{cls.__name__} defines `{hook}`, which configures {feature}; this "
                f"jaxnitro does not support {feature} yet, and will not train while "
                f"ignoring it. Remove `{hook}` for now."
            )
    for name, (default, feature) in _LATER_VALUES.items():
        if name in keywords:
            value, where = keywords[name], f"the keyword {name}="
        elif name in ACCESSOR_KEYWORDS:
            resolved = accessor_value(e, name)
            value, where = resolved.value, f"`{name}` on {cls.__name__}"
        else:
            continue
        if not _is_default(value, default):
            raise NotYetSupportedError(
                f"{where} sets {feature} ({value!r}), which this jaxnitro does not "
                f"support yet; it will not train while ignoring it. Leave it unset."
            )


def _is_default(value: Any, default: Any) -> bool:
    if value is default:
        return True
    try:
        return type(value) is type(default) and bool(value == default)
    except Exception:
        return False


# What an accessor that raised reads as, for the stale check: nothing to compare.
NOT_PASSED: Any = object()


def safe_accessor(e: Any, name: str, cls: type | None = None) -> Any:
    """The accessor's value, or NOT_PASSED when it raises."""
    try:
        return accessor_value(e, name, cls).value
    except Exception:
        return NOT_PASSED


def differs(a: Any, b: Any) -> bool:
    """Whether two accessor values differ (False when `!=` cannot say)."""
    try:
        return bool(a != b)
    except Exception:
        return False
