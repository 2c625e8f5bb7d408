"""The standard module "sexpgpu/optim" (`sgd`, `adamw`, `warmup-stable-decay`,
`cosine`, `constant`) and the core's parameter selection (`select`, `group`).

These are declarations: `check` validates them and resolves each group against
the model's parameter names; `engine` runs them through the engine's parameter
groups and Optax, and `schedule_value` gives a schedule's value at a step.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .core import expect
from .source import Diagnostic, Span, fail
from .values import Builtin, Keyword, kind_of, show


@dataclass(frozen=True)
class ScheduleSpec:
    """A learning-rate schedule: warmup, a stable peak, a decay at the end."""

    name: str
    peak: float
    warmup_steps: int
    decay_fraction: float
    kind = "a schedule"


@dataclass(frozen=True)
class SelectSpec:
    """Parameters chosen by a name pattern (`model.embed.*`) or by rank."""

    pattern: str | None = None
    rank_below: int | None = None
    span: Span | None = field(default=None, compare=False, repr=False)
    """Where the pattern or the rank was written."""
    kind = "a parameter selection"

    def matches(self, name: str, shape: tuple[int, ...]) -> bool:
        """True when the parameter `name` of `shape` is selected."""
        if self.pattern is not None:
            return fnmatch.fnmatchcase(name, self.pattern)
        return self.rank_below is not None and len(shape) < self.rank_below

    def __str__(self) -> str:
        if self.pattern is not None:
            return f'(select "{self.pattern}")'
        return f"(select :rank-below {self.rank_below})"


@dataclass(frozen=True)
class GroupSpec:
    """Parameters of one selection and their hyperparameter overrides."""

    select: SelectSpec
    settings: Mapping[str, Any]
    kind = "an optimizer group"


@dataclass(frozen=True)
class OptimizerSpec:
    """An optimizer: its rule, its default settings and its groups."""

    rule: str
    settings: Mapping[str, Any]
    groups: tuple[GroupSpec, ...] = field(default=())
    kind = "an optimizer"

    def assign(self, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, list[str]]:
        """Each group's parameters (first matching group wins), then `default`."""
        held: dict[str, list[str]] = {str(g.select): [] for g in self.groups}
        held["default"] = []
        for name, shape in shapes.items():
            group = next(
                (g for g in self.groups if g.select.matches(name, shape)), None
            )
            held[str(group.select) if group else "default"].append(name)
        return held


def group_errors(
    optimizer: OptimizerSpec, shapes: Mapping[str, tuple[int, ...]]
) -> list[Diagnostic]:
    """E-CONTRACT-003 for each group that would update no parameter: its select
    matches none (named with the nearest parameter names), repeats an earlier
    group's, or matches only parameters earlier groups hold (the first group that
    selects a parameter holds it)."""
    found: list[Diagnostic] = []
    held = optimizer.assign(shapes)
    seen: dict[str, int] = {}
    for number, group in enumerate(optimizer.groups, 1):
        select, text = group.select, str(group.select)
        if text in seen:
            found.append(
                Diagnostic(
                    "E-CONTRACT-003",
                    f"group {number} repeats group {seen[text]}'s {text}: the first "
                    "group that selects a parameter holds it, so this one updates "
                    "nothing",
                    select.span,
                    "merge the two groups' settings into one",
                )
            )
            continue
        seen[text] = number
        if held[text]:
            continue
        matching = [n for n, s in shapes.items() if select.matches(n, s)]
        if matching:
            earlier = next(
                (i, g)
                for i, g in enumerate(optimizer.groups, 1)
                if matching[0] in held[str(g.select)]
            )
            found.append(
                Diagnostic(
                    "E-CONTRACT-003",
                    f"group {number}'s {text} selects {len(matching)} parameter"
                    f"{'s' if len(matching) != 1 else ''}, all held by group "
                    f"{earlier[0]}'s {earlier[1].select}: it updates nothing",
                    select.span,
                    f"move it before group {earlier[0]}, or remove it",
                )
            )
        elif select.pattern is not None:
            near = _near_parameters(select.pattern, list(shapes))
            found.append(
                Diagnostic(
                    "E-CONTRACT-003",
                    f'group {number}\'s (select "{select.pattern}") matches no '
                    "parameter of the model"
                    + (f"; the nearest: {', '.join(near)}" if near else ""),
                    select.span,
                    (f'did you mean "{near[0]}"? ' if near else "")
                    + "sexpgpu explain lists every parameter's name",
                )
            )
        else:
            lowest = min((len(s) for s in shapes.values()), default=0)
            found.append(
                Diagnostic(
                    "E-CONTRACT-003",
                    f"group {number}'s {text} matches no parameter: the model's "
                    f"parameters have rank {lowest} or more",
                    select.span,
                    f"use :rank-below {lowest + 1} to select the rank-{lowest} ones",
                )
            )
    return found


def _near_parameters(pattern: str, names: list[str]) -> list[str]:
    """The parameter names, or globs of their prefixes (`model.embed.*`), nearest
    to `pattern`, nearest first."""
    import difflib

    globs = {
        ".".join(n.split(".")[:i]) + ".*"
        for n in names
        for i in range(2, len(n.split(".")))
    }
    return difflib.get_close_matches(pattern, [*names, *sorted(globs)], n=3, cutoff=0.6)


def _rate(value: Any, what: str, span: Span) -> Any:
    if isinstance(value, ScheduleSpec):
        return value
    expect(value, (int, float), what, span, "a number or a schedule")
    if value <= 0:
        raise fail("E-EVAL-007", f"{what} must be positive, got {value}", span)
    return float(value)


def _settings(kwargs: dict[str, Any], span: Span) -> dict[str, Any]:
    settings: dict[str, Any] = {}
    for key, value in kwargs.items():
        where = span.at(key)
        if key == "lr":
            settings[key] = _rate(value, "`:lr`", where)
        elif key == "betas":
            if not (
                isinstance(value, tuple)
                and len(value) == 2
                and all(
                    isinstance(b, int | float)
                    and not isinstance(b, bool)
                    and 0 <= b < 1
                    for b in value
                )
            ):
                raise fail(
                    "E-EVAL-007",
                    f"`:betas` must be two numbers in [0, 1), got {show(value)}",
                    where,
                    ":betas [0.9 0.95]",
                )
            settings[key] = tuple(float(b) for b in value)
        elif key != "groups":
            expect(value, (int, float), f"`:{key}`", where, "a number")
            if value < 0:
                raise fail("E-EVAL-007", f"`:{key}` must be >= 0, got {value}", where)
            settings[key] = float(value)
    return settings


def _optimizer(rule: str) -> Any:
    def impl(values: list[Any], kwargs: dict[str, Any], span: Span) -> OptimizerSpec:
        groups = kwargs.get("groups", ())
        if not isinstance(groups, tuple) or not all(
            isinstance(g, GroupSpec) for g in groups
        ):
            raise fail(
                "E-EVAL-007",
                f"`:groups` of `{rule}` must be a vector of "
                f"(group ...), got {kind_of(groups)}",
                span.at("groups"),
            )
        return OptimizerSpec(rule, _settings(kwargs, span), groups)

    return impl


def _group(values: list[Any], kwargs: dict[str, Any], span: Span) -> GroupSpec:
    if not isinstance(values[0], SelectSpec):
        raise fail(
            "E-EVAL-007",
            f"`group` starts with a (select ...), got {kind_of(values[0])}",
            span.at(0),
            '(group (select "model.head.*") :lr 0.01)',
        )
    return GroupSpec(values[0], _settings(kwargs, span))


def _select(values: list[Any], kwargs: dict[str, Any], span: Span) -> SelectSpec:
    if values and not kwargs:
        return SelectSpec(
            pattern=expect(
                values[0],
                str,
                "a `select` pattern",
                span.at(0),
                'a string such as "model.embed.*"',
            ),
            span=span.at(0),
        )
    if "rank-below" in kwargs and not values:
        where = span.at("rank-below")
        rank = expect(kwargs["rank-below"], int, "`:rank-below`", where, "an integer")
        return SelectSpec(rank_below=rank, span=where)
    raise fail(
        "E-EVAL-004",
        "`select` takes a pattern or :rank-below",
        span,
        '(select "model.embed.*") or (select :rank-below 2)',
    )


def _wsd(values: list[Any], kwargs: dict[str, Any], span: Span) -> ScheduleSpec:
    peak = _rate(values[0], "the peak of `warmup-stable-decay`", span.at(0))
    if isinstance(peak, ScheduleSpec):
        raise fail("E-EVAL-007", "the peak of a schedule must be a number", span.at(0))
    warmup = _warmup(kwargs, span)
    fraction = expect(
        kwargs.get("decay-fraction", 0.2),
        (int, float),
        "`:decay-fraction`",
        span.at("decay-fraction"),
        "a number",
    )
    if not 0 <= fraction <= 1:
        raise fail(
            "E-EVAL-007",
            f"`:decay-fraction` of `warmup-stable-decay` is {fraction}, outside "
            "[0, 1]: it is the fraction of the run's steps the rate decays over",
            span.at("decay-fraction"),
            "write :decay-fraction 0.2 (the last fifth of the run)",
        )
    return ScheduleSpec("warmup-stable-decay", peak, warmup, float(fraction))


def _cosine(values: list[Any], kwargs: dict[str, Any], span: Span) -> ScheduleSpec:
    peak = _rate(values[0], "the peak of `cosine`", span.at(0))
    if isinstance(peak, ScheduleSpec):
        raise fail("E-EVAL-007", "the peak of a schedule must be a number", span.at(0))
    return ScheduleSpec("cosine", peak, _warmup(kwargs, span), 1.0)


def _warmup(kwargs: dict[str, Any], span: Span) -> int:
    where = span.at("warmup-steps")
    warmup = expect(
        kwargs.get("warmup-steps", 0), int, "`:warmup-steps`", where, "an integer"
    )
    if warmup < 0:
        raise fail("E-EVAL-007", f"`:warmup-steps` must be >= 0, got {warmup}", where)
    return int(warmup)


def _constant(values: list[Any], kwargs: dict[str, Any], span: Span) -> ScheduleSpec:
    value = _rate(values[0], "the value of `constant`", span.at(0))
    if isinstance(value, ScheduleSpec):
        raise fail("E-EVAL-007", "the value of a schedule must be a number", span.at(0))
    return ScheduleSpec("constant", value, 0, 0.0)


def schedule_value(rate: ScheduleSpec | float, step: int, steps: int) -> float:
    """A learning rate (a number or a schedule) at 0-based `step` of `steps`.

    `warmup-stable-decay` rises linearly over its warmup (reaching the peak at
    step `warmup`), holds, then falls linearly to zero over the last
    `decay-fraction` of the run; `cosine` warms up the same way, then follows a
    half cosine to zero at the last step; `constant` is its value.

    Examples:
        >>> wsd = ScheduleSpec("warmup-stable-decay", 1.0, 2, 0.5)
        >>> [round(schedule_value(wsd, s, 8), 3) for s in range(8)]
        [0.5, 1.0, 1.0, 1.0, 1.0, 0.75, 0.5, 0.25]
    """
    import math

    if not isinstance(rate, ScheduleSpec):
        return float(rate)
    if rate.name == "constant":
        return rate.peak
    if rate.warmup_steps and step < rate.warmup_steps:
        return rate.peak * (step + 1) / rate.warmup_steps
    if rate.name == "cosine":
        span = max(1, steps - rate.warmup_steps)
        done = min(1.0, (step - rate.warmup_steps) / span)
        return rate.peak * 0.5 * (1 + math.cos(math.pi * done))
    decay = round(rate.decay_fraction * steps)
    start = steps - decay
    if decay == 0 or step < start:
        return rate.peak
    return rate.peak * (steps - step) / decay


ADAM_KEYS = ("lr", "betas", "eps", "weight-decay", "groups")
GROUP_KEYS = ("lr", "betas", "eps", "weight-decay", "momentum")


def exports() -> dict[str, Builtin]:
    """The names "sexpgpu/optim" exports."""
    return {
        "sgd": Builtin(
            "sgd",
            _optimizer("sgd"),
            (0, 0),
            ("lr", "momentum", "weight-decay", "groups"),
            ("lr",),
            "(sgd :lr 0.1 :momentum 0.9)",
        ),
        "adamw": Builtin(
            "adamw",
            _optimizer("adamw"),
            (0, 0),
            ADAM_KEYS,
            ("lr",),
            "(adamw :lr 0.001 :betas [0.9 0.95] :weight-decay 0.1)",
        ),
        "warmup-stable-decay": Builtin(
            "warmup-stable-decay",
            _wsd,
            (1, 1),
            ("warmup-steps", "decay-fraction"),
            doc="(warmup-stable-decay peak :warmup-steps 25 :decay-fraction 0.7)",
        ),
        "cosine": Builtin(
            "cosine",
            _cosine,
            (1, 1),
            ("warmup-steps",),
            doc="(cosine peak :warmup-steps 25)",
        ),
        "constant": Builtin("constant", _constant, (1, 1), (), doc="(constant 0.001)"),
    }


def core_names() -> dict[str, Builtin]:
    """`select` and `group`, bound in every run file."""
    return {
        "select": Builtin(
            "select",
            _select,
            (0, 1),
            ("rank-below",),
            doc='(select "model.embed.*") or (select :rank-below 2)',
        ),
        "group": Builtin(
            "group",
            _group,
            (1, 1),
            GROUP_KEYS,
            doc='(group (select "model.head.*") :lr 0.01)',
        ),
    }


def keyword_name(value: Any) -> str | None:
    """The name of a keyword value, else None."""
    return value.name if isinstance(value, Keyword) else None
