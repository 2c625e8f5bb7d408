"""The three optimizer levels: which Optax rule each parameter group runs.

Level 0: the experiment declares no `optimizer`, and every group runs RAdam at its own
learning rate. Level 1: `optimizer(self)` or `optimizer(self, group)` returns an Optax
rule constructor such as `optax.sgd`, which the framework calls with the resolved
values by parameter name (`learning_rate`, and each scheduled field). At both levels
the framework appends `Decay` to a group with weight decay. Level 2: `optimizer(self,
group, hp)` builds the whole chain from this step's traced `hp` (learning_rate,
weight_decay pre-multiplied by it, anchor, no_decay_mask, and each scheduled field);
the chain must end with `Decay` when the group decays, and setup verifies on the host
that every scheduled field changes what the chain computes.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ..compile.fingerprint import fingerprint
from ..errors import ConfigError, HookError
from .decay import Decay

# Fields of Optax rules that cannot be traced or scheduled, beyond what the signature
# shows (booleans, dtypes, strings and callables are never schedulable).
NONSCHEDULABLE: dict[Any, tuple[str, ...]] = {
    optax.radam: ("threshold",),
}


@dataclass(frozen=True)
class RuleSpec:
    """One group's rule: its level, the constructor or factory, its fields."""

    level: int
    build: Callable[..., Any]
    fields: tuple[str, ...]  # schedulable field names (level 0 and 1)
    refused: tuple[str, ...]  # fields that may not be scheduled
    owner: type | None = None  # the experiment class, whose `self.x` the code reads

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
    """The fields of an Optax rule constructor that may not be scheduled."""
    refused = list(NONSCHEDULABLE.get(rule, ()))
    for name, p in _parameters(rule).items():
        default = p.default
        if default is p.empty:
            structural = name != "learning_rate"
        else:
            structural = (
                isinstance(default, bool | str)
                or callable(default)
                or name.endswith("dtype")
            )
        if structural:
            refused.append(name)
    return tuple(dict.fromkeys(refused))


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
        return RuleSpec(
            0, optax.radam, _schedulable(optax.radam), nonschedulable(optax.radam)
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
    return RuleSpec(
        1, rule, _schedulable(rule), nonschedulable(rule), owner=type(experiment)
    )


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
        chain = spec.build(experiment, group, dict(hp))
        if not isinstance(chain, optax.GradientTransformation):
            raise HookError(
                f"optimizer(self, {group!r}, hp) returned {type(chain).__name__}; it "
                f"must return an Optax GradientTransformation (e.g. optax.chain(...))."
            )
        return chain
    kwargs = {"learning_rate": hp["learning_rate"]}
    kwargs.update({name: hp[name] for name in scheduled})
    base = spec.build(**kwargs)
    if decoupled is None:
        return base
    return optax.chain(base, decoupled(hp))


def probe_level2(
    spec: RuleSpec,
    experiment: Any,
    group: str,
    hp: dict[str, Any],
    params: Any,
    scheduled: tuple[str, ...],
    decays: bool,
) -> None:
    """Host checks of a level-2 chain: Decay last, and every scheduled field used."""

    def update(values: dict[str, Any], grads: Any) -> Any:
        chain = spec.build(experiment, group, values)
        updates, _ = chain.update(grads, chain.init(params), params)
        return [np.asarray(u) for u in jax.tree.leaves(updates)]

    def three_steps(values: dict[str, Any]) -> list[Any]:
        # Several steps, so a field that only acts from the second step on (a
        # momentum, a first-moment decay) still shows.
        chain = spec.build(experiment, group, values)
        state = chain.init(params)
        seen = []
        for scale in (1.0, 0.5, 2.0):
            grads = jax.tree.map(lambda p, s=scale: jnp.full_like(p, s), params)
            updates, state = chain.update(grads, state, params)
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
    baseline = three_steps(hp) if scheduled else []
    for name in scheduled:
        base = float(np.asarray(hp[name]))
        other = dict(hp)
        other[name] = np.float32(base * 0.5 + 0.05)
        pairs = zip(baseline, three_steps(other), strict=True)
        if all(np.array_equal(a, b) for a, b in pairs):
            raise ConfigError(
                f"The schedule on `{name}` reaches group {group!r}'s level-2 chain as "
                f"hp[{name!r}], but optimizer(self, {group!r}, hp) never reads it: the "
                f"chain computes the same update for any value. Read hp[{name!r}] in "
                f"the rule it belongs to, or remove the schedule."
            )
