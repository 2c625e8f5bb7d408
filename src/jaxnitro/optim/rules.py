"""The three optimizer levels: which Optax rule each parameter group runs.

Level 0: the experiment declares no `optimizer`, and every group runs RAdam at its own
learning rate. Level 1: `optimizer(self)` or `optimizer(self, group)` returns an Optax
rule constructor such as `optax.sgd`, which the framework calls with the resolved
values by parameter name (`learning_rate`, and each scheduled field). At both levels
the framework appends `Decay` to a group with weight decay. Level 2: `optimizer(self,
group, hp)` builds the whole chain from this step's traced `hp` (learning_rate,
weight_decay pre-multiplied by it, anchor, no_decay_mask, and each scheduled field);
the chain must end with `Decay` when the group decays, and setup verifies on the host
that every scheduled key (`learning_rate` and `weight_decay` included) changes what
the chain computes. A schedule may never set Decay's `anchor` or `no_decay_mask`,
nor a rule's structural fields; a custom rule constructor declares its own with
`declare_nonschedulable`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ..errors import ConfigError, HookError
from ..keys.fingerprint import fingerprint
from .decay import DECAY_NONSCHEDULABLE, Decay

# The declared non-schedulable fields of each rule constructor, beyond what the
# signature shows (booleans, dtypes, strings and callables are never schedulable).
# `declare_nonschedulable` adds a custom rule's; a declaration replaces the last one.
NONSCHEDULABLE: dict[Any, tuple[str, ...]] = {
    optax.radam: ("threshold",),
    Decay: tuple(DECAY_NONSCHEDULABLE),
}


@dataclass(frozen=True)
class RuleSpec:
    """One group's rule: its level, the constructor or factory, its fields."""

    level: int
    build: Callable[..., Any]
    fields: tuple[str, ...]  # schedulable field names (level 0 and 1)
    refused: tuple[str, ...]  # fields that may not be scheduled
    owner: type | None = None  # the experiment class, whose `self.x` the code reads
    # The schedulable fields every step feeds as inputs, scheduled or not, with the
    # value an unscheduled one takes (`traced_defaults`); level 0 and 1.
    defaults: tuple[tuple[str, float], ...] = ()

    def key(self) -> tuple[Any, ...]:
        """The rule's identity for the program key: its level and the fingerprint
        of the code that builds the chain (the level-2 `optimizer` method with what
        it reads on `self`, or the rule the level-1 method returned with what it
        closes over), taken afresh, so an edited rule never reuses a program traced
        from the old one."""
        return (self.level, fingerprint(self.build, owner=self.owner))

    def describe(self) -> str:
        """The rule as a message names it: its builder, level and code digest."""
        build = self.build
        name = getattr(build, "__qualname__", type(build).__qualname__)
        module = getattr(build, "__module__", None)
        where = f"{module}.{name}" if module else name
        return f"{where} (level {self.level}, code {self.key()[1][:16]})"


def nonschedulable(rule: Callable[..., Any]) -> tuple[str, ...]:
    """The fields of an Optax rule constructor that may not be scheduled: those
    `declare_nonschedulable` declared, and those its signature shows are structural
    (a required argument other than the rates, a bool, string, callable or dtype).

    Examples:
        >>> import optax
        >>> nonschedulable(optax.sgd)
        ('nesterov', 'accumulator_dtype')
        >>> nonschedulable(Decay)
        ('anchor', 'no_decay_mask')
    """
    refused = list(NONSCHEDULABLE.get(rule, ()))
    for name, p in _parameters(rule).items():
        default = p.default
        if default is p.empty:
            structural = name not in ("learning_rate", "weight_decay")
        else:
            structural = (
                isinstance(default, bool | str)
                or callable(default)
                or name.endswith("dtype")
            )
        if structural:
            refused.append(name)
    return tuple(dict.fromkeys(refused))


DECLARE_UNKNOWN_FIELD = """\
declare_nonschedulable({rule}, {field!r}): {rule} has no parameter `{field}`, so no \
schedule could reach it. Its parameters are: {known}. Declare the name it takes."""


def declare_nonschedulable(
    rule: Callable[..., Any], *fields: str
) -> Callable[..., Any]:
    """Declare the fields of a custom rule constructor that no schedule may set.

    A schedule's value reaches the rule as a traced array every step, so a field the
    rule branches on in Python (a structural one) cannot take it. After this, setup
    refuses a schedule on any of `fields` with a ConfigError naming it, at levels 0
    and 1, where the framework calls the rule; a level-2 `optimizer(self, group, hp)`
    places hp's values itself. The declaration replaces an earlier one for `rule`
    (declare no fields to withdraw it), and applies to this function object: declare
    it again where the rule is redefined. Returns `rule`, so it can wrap the
    definition.

    Examples:
        >>> import optax
        >>> def clipped_sgd(learning_rate, max_norm=1.0):
        ...     parts = [optax.clip_by_global_norm(max_norm)] if max_norm > 0 else []
        ...     return optax.chain(*parts, optax.sgd(learning_rate))
        >>> clipped_sgd = declare_nonschedulable(clipped_sgd, "max_norm")
        >>> nonschedulable(clipped_sgd)
        ('max_norm',)
    """
    if not callable(rule):
        raise ConfigError(
            f"declare_nonschedulable({rule!r}, ...): the first argument is the rule "
            f"constructor the optimizer hook returns (a function such as "
            f"optax.sgd), not {type(rule).__name__}."
        )
    known = _parameters(rule)
    for name in fields:
        if not isinstance(name, str):
            raise ConfigError(
                f"declare_nonschedulable({_rule_name(rule)}, {name!r}): name each "
                f"field by a string, e.g. declare_nonschedulable({_rule_name(rule)}, "
                f"'max_norm')."
            )
        if known and name not in known:
            raise ConfigError(
                DECLARE_UNKNOWN_FIELD.format(
                    rule=_rule_name(rule), field=name, known=", ".join(known)
                )
            )
    NONSCHEDULABLE[rule] = tuple(dict.fromkeys(fields))
    return rule


def _rule_name(rule: Callable[..., Any]) -> str:
    return str(getattr(rule, "__qualname__", None) or type(rule).__qualname__)


def refusals(spec: RuleSpec, group: str) -> dict[str, str]:
    """Each field a schedule may not set in `group`'s chain, with why and the fix, as
    the binder's refusal words them after the field's name: the rule's own
    non-schedulable fields (levels 0 and 1) and Decay's, at every level."""
    rule = _rule_name(spec.build)
    declared = NONSCHEDULABLE.get(spec.build, ())
    why: dict[str, str] = {}
    for name in spec.refused:
        reason = (
            f"{rule} declares it non-schedulable (declare_nonschedulable)"
            if name in declared
            else f"it is structural in {rule} (a required argument, a bool, string, "
            f"callable or dtype), or not a number"
        )
        why[name] = (
            f"of group {group!r}'s rule is not schedulable: {reason}. Fix its value "
            f"in the rule instead (e.g. return functools.partial({rule}, "
            f"{name}=...) from optimizer()) and remove this schedule."
        )
    for name, where in DECAY_NONSCHEDULABLE.items():
        why[name] = (
            f"is a non-schedulable Decay field (nonschedulable(Decay) = "
            f"{', '.join(DECAY_NONSCHEDULABLE)}): a parameter-sized tree, not a "
            f"number. Set it with {where} instead, and remove this schedule."
        )
    return why


def _parameters(rule: Callable[..., Any]) -> dict[str, inspect.Parameter]:
    try:
        params = inspect.signature(rule).parameters
    except (TypeError, ValueError):
        return {}
    return {
        name: p
        for name, p in params.items()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }


def _schedulable(rule: Callable[..., Any]) -> tuple[str, ...]:
    refused = set(nonschedulable(rule))
    return tuple(name for name in _parameters(rule) if name not in refused)


def optimizer_level(fn: Callable[..., Any] | None) -> int:
    """0 without an `optimizer` hook; 1 for (self[, group]); 2 for (self, group, hp)."""
    if fn is None:
        return 0
    positional = [
        p
        for p in inspect.signature(fn).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if len(positional) >= 3:
        return 2
    return 1


def rule_for_group(
    experiment: Any, optimizer: Callable[..., Any] | None, group: str
) -> RuleSpec:
    """Resolve one group's rule at setup (levels 0 and 1 call the hook here)."""
    level = optimizer_level(optimizer)
    if level == 0:
        fields = _schedulable(optax.radam)
        return RuleSpec(
            0,
            optax.radam,
            fields,
            nonschedulable(optax.radam),
            defaults=traced_defaults(optax.radam, fields),
        )
    if level == 2:
        assert optimizer is not None
        return RuleSpec(2, optimizer, (), (), owner=type(experiment))
    assert optimizer is not None
    positional = [
        p
        for p in inspect.signature(optimizer).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    rule = (
        optimizer(experiment, group) if len(positional) == 2 else optimizer(experiment)
    )
    if not callable(rule) or isinstance(rule, optax.GradientTransformation):
        raise HookError(
            f"optimizer() returned {rule!r}. At level 1 it returns an Optax rule "
            f"constructor, such as optax.sgd (not optax.sgd(0.1)): the framework calls "
            f"it with each step's values. To build the chain yourself, define "
            f"optimizer(self, group, hp) (level 2)."
        )
    names = _parameters(rule)
    if "learning_rate" not in names:
        raise HookError(
            f"optimizer() returned {getattr(rule, '__name__', rule)!r}, which takes no "
            f"`learning_rate`: the framework passes each group's learning rate by "
            f"that name."
        )
    if "weight_decay" in names:
        name = getattr(rule, "__name__", repr(rule))
        raise ConfigError(
            f"optimizer() returned optax.{name}, which decays the weights by itself: "
            f"with the framework's own decoupled Decay (from weight_decay()) the "
            f"weights would decay twice. Return the rule without decay (e.g. "
            f"optax.adam for optax.adamw) and set weight_decay() on the experiment."
        )
    fields = _schedulable(rule)
    return RuleSpec(
        1,
        rule,
        fields,
        nonschedulable(rule),
        owner=type(experiment),
        defaults=traced_defaults(rule, fields),
    )


def traced_defaults(
    rule: Callable[..., Any], fields: tuple[str, ...]
) -> tuple[tuple[str, float], ...]:
    """The schedulable fields of a level-0 or level-1 rule that every step feeds as
    inputs, scheduled or not, each with its default (the value an unscheduled one
    takes): those with a float default that the rule takes traced.

    So which fields a run schedules never changes a program: the rule is built from
    the same traced inputs whatever is scheduled. A field whose default is None, an
    int or not a number (sgd's `momentum=None`, which adds a trace state) still
    reaches the rule only when scheduled, and one the rule branches on in Python
    (a `max_norm > 0`, found by tracing the rule once with `jax.eval_shape`) stays
    a constant, as `declare_nonschedulable` would make it.

    Examples:
        >>> import optax
        >>> [name for name, _ in traced_defaults(optax.adam, ("b1", "b2", "eps"))]
        ['b1', 'b2', 'eps']
    """
    params = _parameters(rule)
    floats = {
        name: float(params[name].default)
        for name in fields
        if name in params
        and name not in ("learning_rate", "weight_decay")
        and isinstance(params[name].default, float | np.floating)
    }
    if not floats:
        return ()
    try:
        return _traced_defaults(rule, tuple(sorted(floats.items())))
    except TypeError:  # an unhashable rule: probed every time
        return _traced_defaults.__wrapped__(rule, tuple(sorted(floats.items())))


@functools.lru_cache(maxsize=256)
def _traced_defaults(
    rule: Callable[..., Any], floats: tuple[tuple[str, float], ...]
) -> tuple[tuple[str, float], ...]:
    if _traces(rule, dict(floats)):
        return floats
    return tuple(
        (name, value) for name, value in floats if _traces(rule, {name: value})
    )


def _traces(rule: Callable[..., Any], values: Mapping[str, float]) -> bool:
    """Whether `rule` builds and steps with `values` (and its learning rate) as
    traced scalars: abstractly, so nothing is computed or compiled."""

    def step(hp: dict[str, Any]) -> Any:
        tx = rule(**hp)
        params = jnp.zeros(2)
        updates, _ = tx.update(params, tx.init(params), params)
        return updates

    hp = {"learning_rate": np.float32(0.1)}
    hp.update({name: np.float32(value) for name, value in values.items()})
    try:
        jax.eval_shape(step, hp)
    except Exception:  # the rule needs a constant there: it stays one
        return False
    return True


def build_chain(
    spec: RuleSpec,
    experiment: Any,
    group: str,
    hp: Mapping[str, Any],
    scheduled: tuple[str, ...],
    decoupled: Callable[[Mapping[str, Any]], Any] | None,
) -> optax.GradientTransformation:
    """One group's chain for this step, from its (traced) hyperparameters."""
    if spec.level == 2:
        return level2_chain(spec, experiment, group, hp)
    kwargs = {"learning_rate": hp["learning_rate"]}
    kwargs.update({name: hp[name] for name in scheduled})
    base = spec.build(**kwargs)
    if decoupled is None:
        return base
    return optax.chain(base, decoupled(hp))


def level2_chain(
    spec: RuleSpec, experiment: Any, group: str, hp: Mapping[str, Any]
) -> optax.GradientTransformation:
    """Call a level-2 `optimizer(self, group, hp)`, refusing what is not a chain."""
    chain = spec.build(experiment, group, dict(hp))
    if not isinstance(chain, optax.GradientTransformation):
        raise HookError(
            f"optimizer(self, {group!r}, hp) returned {type(chain).__name__} "
            f"({_short(chain)}); it must return an Optax GradientTransformation "
            f"built from hp on each call, e.g. "
            f"optax.chain(optax.sgd(hp['learning_rate']))."
        )
    return chain


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# How far the probe moves each weight off its value before stepping the chain.
_PROBE_OFFSET = 0.375
# The rate the probe steps at where step 0's rate is zero.
_PROBE_RATE = 0.05


def probe_level2(
    spec: RuleSpec,
    experiment: Any,
    group: str,
    hp: dict[str, Any],
    params: Any,
    scheduled: tuple[str, ...],
    decays: bool,
) -> None:
    """Host checks of a level-2 chain: a chain at all, Decay last, and every
    scheduled key used.

    `scheduled`: every key of `hp` a schedule sets for this group, `learning_rate`
    and `weight_decay` included: each must change what the chain computes.
    """
    level2_chain(spec, experiment, group, hp)  # even where nothing else is checked

    def update(values: dict[str, Any], grads: Any) -> Any:
        chain = level2_chain(spec, experiment, group, values)
        updates, _ = chain.update(grads, chain.init(params), params)
        return [np.asarray(u) for u in jax.tree.leaves(updates)]

    # Off the anchor, so a scheduled weight_decay shows even where the weights
    # start at their anchor ("w0") or at zero, and whatever the learning rate.
    moved = jax.tree.map(lambda p: p + _PROBE_OFFSET, params)

    def three_steps(values: dict[str, Any]) -> list[Any]:
        # Several steps, so a field that only acts from the second step on (a
        # momentum, a first-moment decay) still shows.
        chain = level2_chain(spec, experiment, group, values)
        state = chain.init(moved)
        seen = []
        for scale in (1.0, 0.5, 2.0):
            grads = jax.tree.map(lambda p, s=scale: jnp.full_like(p, s), moved)
            updates, state = chain.update(grads, state, moved)
            seen += [np.asarray(u) for u in jax.tree.leaves(updates)]
        return seen

    zeros = jax.tree.map(jnp.zeros_like, params)
    if decays:
        # What Decay alone makes of zero updates: what a chain ending in it must give.
        decay = Decay(hp["weight_decay"], hp["anchor"], hp["no_decay_mask"])
        expected, _ = decay.update(zeros, decay.init(params), params)
        got = update(hp, zeros)
        want = [np.asarray(x) for x in jax.tree.leaves(expected)]
        if len(got) != len(want) or not all(
            np.allclose(g, w, rtol=1e-4, atol=1e-7)
            for g, w in zip(got, want, strict=False)
        ):
            raise HookError(
                f"optimizer(self, {group!r}, hp): group {group!r} decays, but its "
                f"chain does not end with jaxnitro.Decay(hp['weight_decay'], "
                f"hp['anchor'], hp['no_decay_mask']). Decay must be last, after the "
                f"base rule, so the coefficient arrives pre-multiplied by the "
                f"learning rate."
            )
    # At a warmup's zero rate, every field the rate multiplies (a momentum) would
    # look unread: the probe steps at a non-zero rate instead.
    probe = dict(hp)
    if float(np.asarray(hp["learning_rate"])) == 0.0:
        probe["learning_rate"] = np.float32(_PROBE_RATE)
    baseline = three_steps(probe) if scheduled else []
    for name in scheduled:
        base = float(np.asarray(probe[name]))
        other = dict(probe)
        other[name] = np.float32(base * 0.5 + 0.05)
        pairs = zip(baseline, three_steps(other), strict=True)
        if all(np.array_equal(a, b) for a, b in pairs):
            raise ConfigError(
                f"The schedule on `{name}` reaches group {group!r}'s level-2 chain as "
                f"hp[{name!r}], but optimizer(self, {group!r}, hp) never reads it: the "
                f"chain computes the same update for any value. Read hp[{name!r}] in "
                f"the rule it belongs to, or remove the schedule."
            )
