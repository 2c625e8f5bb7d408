"""Schedules: values that vary with the optimizer step, bound to where they land.

`schedules()` returns a dict. Every entry is a factory of the horizon (called once with
`total = max_epochs * (len(train) // accum)`, returning `step -> value`), a schedule
itself (an Optax schedule works as is), a bare number, or a `Plateau`. A key binds by
name to an optimizer rule field (Optax's own keyword: `learning_rate`, `momentum`,
`b1`, ..., and `weight_decay` for the decay coefficient), to a Device field, or to a
gradient rule field (`rho`). Reserved namespaces say where when a name is ambiguous:

    {"learning_rate": lambda total: optax.cosine_decay_schedule(1e-3, total),
     "device": {"smoothing": lambda total: lambda t: 0.1 * (t < 100)},
     "opt": {"encoder": {"learning_rate": 1e-4}},   # one group's chain only
     "grad": {"rho": 0.05},
     "bind": {"sam_warm": ...}}                     # for grad_rule(self, hp)

Dotted keys ("opt.encoder.learning_rate") mean the same. Values are computed on the host
every step and reach the programs as inputs, so a changed schedule compiles nothing.
"""

from __future__ import annotations

import logging
import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..watch import (
    check_mode,
    check_pair,
    did_you_mean,
    follow_monitor,
    read_watched,
)

NAMESPACES = ("device", "opt", "grad", "bind")
log = logging.getLogger("jaxnitro")


class Plateau:
    """A schedule factory scaled down when the validation metric stops improving.

    The value at step t is `inner(t) * scale`; the scale starts at 1 and is updated
    once per epoch after validation with PyTorch's ReduceLROnPlateau rule and
    defaults, applying from the next epoch's first step. `inner` is any schedule
    entry or a bare number. An unscored epoch (`watch.is_unscored`: the metric NaN
    or infinite, or the validation pass's forward outputs were) is a bad epoch.

    Examples:
        >>> p = Plateau(1e-3, patience=0)
        >>> state = p.state_for(("loss", "min"))
        >>> [state.update(v) for v in (1.0, 0.9, 0.95)], state.scale
        ([False, False, True], 0.1)
    """

    def __init__(
        self,
        inner: Any,
        *,
        metric: str | None = None,
        mode: str | None = None,
        factor: float = 0.1,
        patience: int = 10,
        cooldown: int = 0,
        threshold: float = 1e-4,
        threshold_mode: str = "rel",
        min_scale: float = 0.0,
    ) -> None:
        if isinstance(inner, Plateau):
            raise ConfigError("Plateau(inner) cannot wrap another Plateau.")
        check_mode(mode, "Plateau")
        check_pair(metric, mode, "Plateau")
        if not 0 < float(factor) < 1:
            raise ConfigError(f"Plateau(factor={factor!r}) must be in (0, 1).")
        if not isinstance(patience, int) or patience < 0:
            raise ConfigError(f"Plateau(patience={patience!r}) must be an int >= 0.")
        if not isinstance(cooldown, int) or cooldown < 0:
            raise ConfigError(f"Plateau(cooldown={cooldown!r}) must be an int >= 0.")
        if threshold_mode not in ("rel", "abs"):
            raise ConfigError(
                f'Plateau(threshold_mode={threshold_mode!r}) must be "rel" or "abs".'
            )
        if not float(min_scale) >= 0:
            raise ConfigError(f"Plateau(min_scale={min_scale!r}) must be >= 0.")
        self.inner = inner
        self.metric, self.mode = metric, mode
        self.factor, self.patience, self.cooldown = float(factor), patience, cooldown
        self.threshold, self.threshold_mode = float(threshold), threshold_mode
        self.min_scale = float(min_scale)

    def __repr__(self) -> str:
        return (
            f"Plateau({self.inner!r}, metric={self.metric!r}, mode={self.mode!r}, "
            f"factor={self.factor}, patience={self.patience})"
        )

    def state_for(self, monitor: tuple[str, str] | None) -> PlateauState:
        """Fresh counters for one key of one handle, following `monitor` if unset."""
        metric, mode = follow_monitor(
            self.metric,
            self.mode,
            monitor,
            owner="Plateau",
            spelled="Plateau(..., metric=..., mode=...)",
        )
        return PlateauState(metric, mode, self)


@dataclass
class PlateauState:
    """One key's Plateau counters (PyTorch's ReduceLROnPlateau bookkeeping)."""

    metric: str
    mode: str
    rule: Plateau
    scale: float = 1.0
    best: float = math.nan
    bad_epochs: int = 0
    cooldown_left: int = 0

    def _improves(self, value: float) -> bool:
        if not math.isfinite(value):  # warned of by evaluation: a bad epoch
            return False
        if math.isnan(self.best):
            return True
        t = self.rule.threshold
        if self.rule.threshold_mode == "rel":
            bound = self.best * (1 - t) if self.mode == "min" else self.best * (1 + t)
        else:
            bound = self.best - t if self.mode == "min" else self.best + t
        return value < bound if self.mode == "min" else value > bound

    def update(self, value: float) -> bool:
        """One epoch's metric; whether the scale was reduced."""
        if self._improves(value):
            self.best, self.bad_epochs = value, 0
        else:
            self.bad_epochs += 1
        if self.cooldown_left > 0:
            self.cooldown_left -= 1
            self.bad_epochs = 0
        if self.bad_epochs > self.rule.patience:
            new = max(self.scale * self.rule.factor, self.rule.min_scale)
            self.cooldown_left = self.rule.cooldown
            self.bad_epochs = 0
            if self.scale - new > 1e-12:
                self.scale = new
                return True
        return False

    def state(self) -> dict[str, Any]:
        """The counters, as a checkpoint stores them."""
        return {
            "metric": self.metric,
            "mode": self.mode,
            "scale": self.scale,
            "best": None if math.isnan(self.best) else self.best,
            "bad_epochs": self.bad_epochs,
            "cooldown_left": self.cooldown_left,
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Continue a checkpoint's sequence."""
        self.scale = float(state["scale"])
        self.best = math.nan if state.get("best") is None else float(state["best"])
        self.bad_epochs = int(state["bad_epochs"])
        self.cooldown_left = int(state["cooldown_left"])


@dataclass(frozen=True)
class Target:
    """Where a schedule lands: a namespace, a group (opt only, None: every group
    that has the field) and a field name."""

    namespace: str
    name: str
    group: str | None = None

    def log_key(self, group: str | None = None) -> str:
        """The train line's key: `schedule/<group>/<field>` for a rule field as it
        reaches `group` (an opt target is logged per group), `schedule/<field>` for a
        Device field, `schedule/grad/<field>` and `schedule/bind/<name>` otherwise."""
        if self.namespace == "opt":
            return f"schedule/{group or self.group}/{self.name}"
        if self.namespace in ("grad", "bind"):
            return f"schedule/{self.namespace}/{self.name}"
        return f"schedule/{self.name}"


@dataclass
class BoundSchedule:
    """One schedule key, resolved: its target, its per-step function, its Plateau."""

    key: str
    target: Target
    fn: Callable[[int], Any]
    constant: bool
    plateau: PlateauState | None = None

    def value(self, step: int) -> float:
        raw = self.fn(step)
        try:
            value = float(np.asarray(raw))
        except (TypeError, ValueError):
            raise ConfigError(
                f"Schedule `{self.key}` returned {raw!r} at step {step}; a schedule "
                f"returns a number."
            ) from None
        if not math.isfinite(value):
            raise ConfigError(f"Schedule `{self.key}` returned {value} at step {step}.")
        return value * (self.plateau.scale if self.plateau is not None else 1.0)


def _step_function(
    key: str, entry: Any, total: int
) -> tuple[Callable[[int], Any], bool]:
    if isinstance(entry, bool) or not (
        isinstance(entry, numbers.Real) or callable(entry)
    ):
        raise ConfigError(
            f"Schedule `{key}` is {entry!r}; an entry is a factory of the horizon "
            f"(total -> (step -> value)), a schedule (step -> value), a number, or a "
            f"Plateau."
        )
    if isinstance(entry, numbers.Real):
        value = float(entry)
        return (lambda step: value), True
    made = entry(total)
    if callable(made):
        return made, False
    return entry, False  # a schedule of the step itself, e.g. an Optax schedule


@dataclass
class Bindable:
    """What a schedule key may bind to, gathered at setup."""

    device_fields: tuple[str, ...]
    groups: tuple[str, ...]
    rule_fields: dict[str, tuple[str, ...]]  # group -> schedulable rule fields
    # group -> each refused field, with why and the fix (rules.refusals)
    nonschedulable: dict[str, Mapping[str, str]]
    open_groups: tuple[str, ...] = ()  # level-2 groups: any opt field may bind
    grad_fields: tuple[str, ...] = ()
    per_group_weight_decay: bool = False
    candidates: dict[str, list[Target]] = field(default_factory=dict)
    other_fields: dict[str, str] = field(default_factory=dict)
    """The experiment's fields no schedule binds to, by name: their marker."""
    manual: bool = False
    """Manual mode: the groups are the subtrees of the experiment's optimizer
    states, and their rule fields the hyperparameters those expose."""

    @property
    def rule_hint(self) -> str:
        """What a refusal of a rule field adds: in manual mode, how a rule exposes
        its hyperparameters to schedules."""
        if not self.manual:
            return ""
        return (
            " In manual mode a schedule sets a hyperparameter the optimizer states "
            "setup_optimizers built expose: build the rule with "
            "optax.inject_hyperparams, e.g. setup_optimizer(optax.inject_hyperparams"
            "(optax.adam)(learning_rate=1e-3), params)."
        )

    def bare(self, key: str) -> list[Target]:
        found: list[Target] = []
        rule_names = [*self.rule_fields.values(), *self.nonschedulable.values()]
        if any(key in names for names in rule_names):  # refused later, with reason
            found.append(Target("opt", key))
        if key in self.device_fields:
            found.append(Target("device", key))
        if key in self.grad_fields:
            found.append(Target("grad", key))
        if not found and self.open_groups:
            found.append(Target("opt", key))
        return found


def _flatten_table(table: Mapping[str, Any]) -> list[tuple[tuple[str, ...], Any]]:
    items: list[tuple[tuple[str, ...], Any]] = []

    def walk(prefix: tuple[str, ...], value: Any) -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                walk((*prefix, *str(k).split(".")), v)
        else:
            items.append((prefix, value))

    for key, value in table.items():
        walk(tuple(str(key).split(".")), value)
    return items


def _check_opt_field(bindable: Bindable, target: Target, key: str, entry: Any) -> None:
    groups = [target.group] if target.group is not None else list(bindable.groups)
    for group in groups:
        why = bindable.nonschedulable.get(group, {}).get(target.name)
        if why is not None:
            raise ConfigError(f"{_shown(key, entry)}: `{target.name}` {why}")
    has = [
        g
        for g in groups
        if target.name in bindable.rule_fields.get(g, ()) or g in bindable.open_groups
    ]
    if not has:
        known = sorted({f for g in groups for f in bindable.rule_fields.get(g, ())})
        raise ConfigError(
            f"Schedule `{key}`: no rule of {', '.join(map(repr, groups))} has a field "
            f"`{target.name}`. The rule fields are: {', '.join(known) or 'none'}."
            f"{bindable.rule_hint}"
        )
    if target.name == "weight_decay" and bindable.per_group_weight_decay:
        raise ConfigError(
            f"Schedule `{key}` schedules the decay coefficient while the experiment "
            f"also defines weight_decay(group): the two would fight over one value. "
            f"Schedule it or define it per group, not both."
        )


def bind_schedules(
    table: Mapping[str, Any],
    *,
    total: int,
    bindable: Bindable,
    monitor: tuple[str, str] | None,
) -> list[BoundSchedule]:
    """Resolve every key of a schedules table to its target, or raise naming why."""
    if not isinstance(table, Mapping):
        raise ConfigError(
            f"schedules must be a dict of key -> schedule; got {type(table).__name__}."
        )
    bound: list[BoundSchedule] = []
    seen: dict[Target, str] = {}
    for path, entry in _flatten_table(table):
        key = ".".join(path)
        if path[0] in NAMESPACES:
            target = _namespaced(path, key, bindable)
        else:
            if len(path) != 1:
                raise ConfigError(
                    f"Schedule `{key}`: a nested key must start with a namespace "
                    f"({', '.join(NAMESPACES)})."
                )
            found = bindable.bare(path[0])
            marker = bindable.other_fields.get(key)
            if not found and marker is not None:
                raise ConfigError(
                    f"Schedule `{key}` names a {marker} field of the experiment, "
                    f"which no schedule can set: a scheduled value reaches the "
                    f"programs as an input each step, and only a Device field is "
                    f"an input ({marker} is "
                    + (
                        "baked into the compiled graph"
                        if marker == "GraphConst"
                        else "never seen by traced code"
                    )
                    + f"). Mark `{key}` Device[...] to schedule it."
                )
            if not found:
                rule_fields = sorted(
                    {f for fs in bindable.rule_fields.values() for f in fs}
                )
                known = [*rule_fields, *bindable.device_fields, *bindable.grad_fields]
                raise ConfigError(
                    f"Schedule `{key}` binds nowhere: it is no rule field "
                    f"({', '.join(rule_fields)}), "
                    f"no Device field ({', '.join(bindable.device_fields) or 'none'}) "
                    f"and no gradient-rule field "
                    f"({', '.join(bindable.grad_fields) or 'none'})."
                    f"{did_you_mean(key, known)}{bindable.rule_hint}"
                )
            if len(found) > 1:
                spelled = ", ".join(f"{t.namespace}.{t.name}" for t in found)
                raise ConfigError(
                    f"Schedule `{key}` binds to {len(found)} places: {spelled}. Say "
                    f"which with its namespace, e.g. {{'{found[0].namespace}': "
                    f"{{'{key}': ...}}}}."
                )
            target = found[0]
        if target.namespace == "opt":
            _check_opt_field(bindable, target, key, entry)
        if target in seen:
            raise ConfigError(
                f"Schedules `{seen[target]}` and `{key}` bind to the same place."
            )
        seen[target] = key
        plateau = None
        inner = entry
        if isinstance(entry, Plateau):
            plateau, inner = entry.state_for(monitor), entry.inner
        fn, constant = _step_function(key, inner, total)
        bound.append(
            BoundSchedule(key, target, fn, constant and plateau is None, plateau)
        )
    return bound


def _shown(key: str, entry: Any) -> str:
    """A schedule as a message names it: with its value when it is a number or a
    Plateau."""
    if isinstance(entry, numbers.Real | Plateau):
        return f"Schedule `{key}` = {entry!r}"
    return f"Schedule `{key}`"


def _namespaced(path: tuple[str, ...], key: str, bindable: Bindable) -> Target:
    namespace, rest = path[0], path[1:]
    if namespace == "opt" and len(rest) == 2:
        group, name = rest
        if group not in bindable.groups:
            kind = (
                "subtree of the optimizer states holding an OptState"
                if bindable.manual
                else "parameter group"
            )
            raise ConfigError(
                f"Schedule `{key}`: there is no {kind} {group!r}. The "
                f"{'subtrees' if bindable.manual else 'groups'} are: "
                f"{', '.join(bindable.groups)}."
            )
        return Target("opt", name, group)
    if len(rest) != 1:
        raise ConfigError(
            f"Schedule `{key}`: write {namespace}.<field>"
            + (" or opt.<group>.<field>" if namespace == "opt" else "")
            + "; group paths are one level."
        )
    name = rest[0]
    if namespace == "device" and name not in bindable.device_fields:
        raise ConfigError(
            f"Schedule `{key}`: `{name}` is not a Device field. The Device fields "
            f"are: {', '.join(bindable.device_fields) or 'none'}."
        )
    if namespace == "grad" and name not in bindable.grad_fields:
        raise ConfigError(
            f"Schedule `{key}`: the gradient rule has no schedulable field `{name}` "
            f"(it has: {', '.join(bindable.grad_fields) or 'none'})."
        )
    return Target(namespace, name)


def check_plateau_metrics(
    bound: list[BoundSchedule], metrics: Mapping[str, Any], *, epoch: int
) -> dict[str, float]:
    """Update every Plateau from epoch `epoch`'s validation metrics, reporting each
    reduction at INFO on the "jaxnitro" logger; the scales by log key."""
    scales = {}
    for schedule in bound:
        state = schedule.plateau
        if state is None:
            continue
        value = read_watched(
            metrics,
            state.metric,
            "Plateau metric",
            error=ConfigError,
            watcher=f"Plateau on `{schedule.key}` watches `{state.metric}`",
            non_finite_ok=True,
        )
        if state.update(value):
            log.info(
                "Plateau on schedule `%s`: `%s` stopped improving (%.6g at epoch %d); "
                "scale reduced to %.6g from the next epoch.",
                schedule.key,
                state.metric,
                value,
                epoch,
                state.scale,
            )
        scales[f"schedule/plateau/{schedule.key}"] = state.scale
    return scales
