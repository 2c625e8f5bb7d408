"""Building a run's `OptimizerPlan` from the experiment's optimization hooks.

Setup calls, once and on the host: `param_group(keypath)` for every leaf,
`learning_rate(group)`, `weight_decay(group)`, `decay_anchor(group)`, `optimizer`
(levels 0 to 2), `no_decay(keypath, leaf)`, `grad_rule()`, `no_perturb` and
`adaptive_perturb`, and binds the `schedules` table. Each is a method; the per-group
ones may take the group argument or not, and `learning_rate`, `weight_decay` and
`decay_anchor` may instead be a field of the same name (one value for every group).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ..errors import ConfigError, HookError
from ..experiment.base import DEFAULT_LEARNING_RATE, Experiment, defines
from ..experiment.traits import field_names, graphconst_fields, host_fields
from .decay import anchor_checksum, anchor_mismatch, check_anchor
from .ema import EMA
from .grad_rules import GradRule, PerturbRule, SingleGrad, check_grad_rule
from .groups import (
    DEFAULT_GROUP,
    default_adaptive_perturb,
    default_no_decay,
    group_layout,
    leaf_mask,
)
from .plan import GroupPlan, OptimizerPlan, grad_rule_hp
from .rules import optimizer_level, probe_level2, refusals, rule_for_group
from .schedules import Bindable, BoundSchedule, bind_schedules


@dataclass(frozen=True)
class PlanInputs:
    """What setup resolved elsewhere that the plan depends on."""

    schedules: Any
    clip_norm: float
    ema: EMA | None
    total: int
    monitor: tuple[str, str] | None
    device_fields: tuple[str, ...]
    # Manual mode: what each subtree of the experiment's optimizer states exposes
    # to schedules (`optim.manual.hyperparameters_by_subtree`); None otherwise.
    manual_fields: Mapping[str, tuple[str, ...]] | None = None


# The accessors `group_value` reads, which a field of the same name may set; every
# other hook setup calls is code that a field cannot stand in for.
FIELD_ACCESSORS = ("learning_rate", "weight_decay", "decay_anchor")


def _method(e: Any, name: str) -> Callable[..., Any] | None:
    """The hook `name` of `e`'s class, or None.

    A field of that name is never the hook: the class attribute is only the field's
    default. `group_value` reads the field's value instead, for the accessors that
    take one; for the other hooks the field is refused.
    """
    cls = type(e)
    if name in field_names(cls):
        if name in FIELD_ACCESSORS:
            return None
        raise ConfigError(
            f"{cls.__name__} has a field `{name}`, but `{name}` is a hook setup calls, "
            f"not a value a field can hold. Define it as a method, "
            f"`def {name}(self, ...)`, and rename the field."
        )
    if isinstance(e, Experiment):
        return getattr(cls, name) if defines(cls, name) else None
    attr = getattr(cls, name, None)
    return attr if callable(attr) else None


def _takes_group(fn: Callable[..., Any]) -> bool:
    params = [
        p
        for p in inspect.signature(fn).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    return len(params) >= 2


def group_value(e: Any, name: str, group: str, default: Any) -> Any:
    """An accessor's value for `group`: a field, a method (with or without the group
    argument), or the default."""
    if name in field_names(type(e)):
        return getattr(e, name)
    fn = _method(e, name)
    if fn is None:
        return default
    return fn(e, group) if _takes_group(fn) else fn(e)


HYPERPARAMETER_NUMBER = (
    "{cls}.{name} gave {value!r} (a {kind}) for the {group!r} group; it must be a "
    "number, and a string is refused even when it reads as one. Write the number "
    "itself, e.g. {name}={example}."
)


def group_number(e: Any, name: str, group: str, default: float) -> float:
    """`group_value` for a numeric hyperparameter (learning_rate, weight_decay),
    as a float; a string or a bool is refused by name rather than converted."""
    value = group_value(e, name, group, default)
    try:
        if isinstance(value, str | bytes | bool):
            raise TypeError(value)
        return float(value)
    except (TypeError, ValueError):
        raise ConfigError(
            HYPERPARAMETER_NUMBER.format(
                cls=type(e).__name__,
                name=name,
                value=value,
                kind=type(value).__name__,
                group=group,
                example=default or 1e-4,
            )
        ) from None


def _masked(tree: Any, labels: Any, group: str, single: bool) -> Any:
    """`tree` restricted to `group`'s leaves (other leaves MaskedNode), as
    `optax.multi_transform` hands a group's parameters to its chain."""
    if single or tree is None:
        return tree
    return jax.tree.map(
        lambda leaf, label: leaf if label == group else optax.MaskedNode(), tree, labels
    )


def _anchor_tree(
    group: str, kind: str, value: Any, w0: Callable[[], Any], params: Any
) -> Any:
    if kind == "zero":
        return None
    if kind == "w0":
        return w0()
    try:
        tree = jax.tree.map(jnp.asarray, value)
        problem = anchor_mismatch(tree, params)
    except Exception as error:
        problem = f"{type(error).__name__}: {error}"
    if problem is not None:
        raise ConfigError(
            f"decay_anchor({group!r}) returned a tree that does not match the "
            f'parameters leaf for leaf ({problem}); return "zero", "w0", or a '
            f"tree with the parameters' structure and shapes."
        )
    return tree


def build_plan(
    e: Any, params: Any, w0: Callable[[], Any], inputs: PlanInputs
) -> OptimizerPlan:
    """Resolve every optimization hook of `e` into the run's plan."""
    param_group = _method(e, "param_group")
    layout = group_layout(
        params, None if param_group is None else lambda keypath: param_group(e, keypath)
    )
    labels = layout.label_tree(params)
    single = len(layout.names) == 1

    base_lr = group_number(e, "learning_rate", DEFAULT_GROUP, DEFAULT_LEARNING_RATE)
    decays_mask = _decays_mask(e, params)
    optimizer = _method(e, "optimizer")
    level = optimizer_level(optimizer)

    specs = {g: rule_for_group(e, optimizer, g) for g in layout.names}
    weight_decay = {g: group_number(e, "weight_decay", g, 0.0) for g in layout.names}
    bindable = _bindable(e, inputs, layout.names, specs)
    rule, rule_fn = _grad_rule(e)
    bindable.grad_fields = rule.schedulable
    bound = bind_schedules(
        inputs.schedules or {},
        total=inputs.total,
        bindable=bindable,
        monitor=inputs.monitor,
    )
    if rule_fn is not None:
        rule = _placed_grad_rule(e, rule_fn, rule, bound)
    decay_scheduled = _scheduled_groups(bound, "weight_decay", layout.names)

    groups = []
    for g in layout.names:
        if g not in layout.labels:
            continue  # "default" with no leaf of its own
        lr_g = float(group_value(e, "learning_rate", g, base_lr))
        anchor_value = group_value(e, "decay_anchor", g, "zero")
        kind = check_anchor(g, anchor_value)
        decays = weight_decay[g] != 0 or g in decay_scheduled
        anchor = _anchor_tree(g, kind, anchor_value, w0, params) if decays else None
        groups.append(
            GroupPlan(
                name=g,
                rule=specs[g],
                lr_ratio=lr_g / base_lr if base_lr else float("nan"),
                weight_decay=weight_decay[g],
                decays=decays,
                anchor=_masked(anchor, labels, g, single),
                mask=_masked(decays_mask, labels, g, single),
                scheduled=_rule_inputs(specs[g], g, bound),
            )
        )
    masks = _perturb_masks(e, params) if isinstance(rule, PerturbRule) else None
    plan = OptimizerPlan(
        base_lr=base_lr,
        clip_norm=inputs.clip_norm,
        layout=layout,
        groups=tuple(groups),
        labels=labels,
        schedules=tuple(bound),
        grad_rule=rule,
        grad_rule_fn=rule_fn,
        perturb_masks=masks,
        ema=inputs.ema,
        experiment=e,
        manual_fields=inputs.manual_fields,
    )
    if level == 2:
        _probe_level2_groups(e, plan, params, bound)
    return plan


def _decays_mask(e: Any, params: Any) -> Any:
    """Per leaf, 1.0 where weight decay applies and 0.0 where `no_decay` (or the
    default rule) excludes it, as NumPy float32 scalars (`leaf_mask`)."""
    no_decay = _method(e, "no_decay")
    excluded = leaf_mask(
        params,
        (lambda k, x: no_decay(e, k, x)) if no_decay is not None else default_no_decay,
        "no_decay",
    )
    return jax.tree.map(lambda m: np.float32(1.0 - m), excluded)


def _bindable(
    e: Any, inputs: PlanInputs, groups: tuple[str, ...], specs: dict[str, Any]
) -> Bindable:
    """What the `schedules` table may bind to: the Device fields and each group's
    rule fields, or in manual mode what the optimizer states expose (the gradient
    rule's fields are added once the rule is known)."""
    wd_method = _method(e, "weight_decay")
    bindable = Bindable(
        device_fields=inputs.device_fields,
        groups=groups,
        rule_fields={
            g: tuple(dict.fromkeys((*spec.fields, "learning_rate", "weight_decay")))
            for g, spec in specs.items()
        },
        nonschedulable={g: refusals(spec, g) for g, spec in specs.items()},
        open_groups=tuple(g for g, spec in specs.items() if spec.level == 2),
        grad_fields=(),
        per_group_weight_decay=wd_method is not None and _takes_group(wd_method),
        other_fields={
            **dict.fromkeys(host_fields(type(e)), "Host"),
            **dict.fromkeys(graphconst_fields(type(e)), "GraphConst"),
        },
    )
    if inputs.manual_fields is not None:
        # Manual mode: an opt key binds into the optimizer states' exposed
        # hyperparameters, a path `opt.<subtree>.<field>` into one subtree.
        bindable.groups = tuple(inputs.manual_fields)
        bindable.rule_fields = dict(inputs.manual_fields)
        bindable.nonschedulable = {}
        bindable.open_groups = ()
        bindable.per_group_weight_decay = False
        bindable.manual = True
    return bindable


def _rule_inputs(spec: Any, group: str, bound: list[BoundSchedule]) -> tuple[str, ...]:
    """The rule fields of `group`'s chain that are program inputs, sorted."""
    # The rule's fields with a float default are inputs whatever is scheduled
    # (`traced_defaults`), so which keys a run schedules compiles nothing.
    return tuple(
        sorted(
            {name for name, _ in spec.defaults}
            | {
                s.target.name
                for s in bound
                if s.target.namespace == "opt"
                and s.target.group in (None, group)
                and s.target.name not in ("learning_rate", "weight_decay")
                and (s.target.name in spec.fields or spec.level == 2)
            }
        )
    )


def _perturb_masks(e: Any, params: Any) -> dict[str, Any]:
    """A perturbing gradient rule's (SAM, ASAM) masks: `perturb` (1.0 where a leaf
    is perturbed, 0.0 where `no_perturb` excludes it) and `adaptive` (the leaves
    whose perturbation scales with the weight, `adaptive_perturb`)."""
    no_perturb = _method(e, "no_perturb")
    adaptive = _method(e, "adaptive_perturb")
    return {
        "perturb": jax.tree.map(
            lambda m: np.float32(1.0 - m),
            leaf_mask(
                params,
                (lambda k, x: no_perturb(e, k, x))
                if no_perturb is not None
                else (lambda k, x: False),
                "no_perturb",
            ),
        ),
        "adaptive": leaf_mask(
            params,
            (lambda k, x: adaptive(e, k, x))
            if adaptive is not None
            else default_adaptive_perturb,
            "adaptive_perturb",
        ),
    }


def _probe_level2_groups(
    e: Any, plan: OptimizerPlan, params: Any, bound: list[BoundSchedule]
) -> None:
    """The setup checks of every group's level-2 chain with step 0's inputs
    (`rules.probe_level2`: a chain at all, Decay last, every scheduled key used)."""
    single = len(plan.layout.names) == 1
    hp = plan.step_inputs(0)
    for resolved in plan.groups:
        probe_level2(
            resolved.rule,
            e,
            resolved.name,
            hp.groups[resolved.name],
            _masked(params, plan.labels, resolved.name, single),
            _level2_probed(resolved, bound),
            resolved.decays,
        )


def _level2_probed(group: GroupPlan, bound: list[BoundSchedule]) -> tuple[str, ...]:
    """Every key of a level-2 group's `hp` that a schedule sets, for the probe:
    its scheduled rule fields, and `learning_rate` and `weight_decay` when a
    schedule sets them for this group (`weight_decay` only where some leaf of the
    group decays, since `no_decay` leaves never read it)."""
    keys = list(group.scheduled)
    targets = {
        s.target.name
        for s in bound
        if s.target.namespace == "opt" and s.target.group in (None, group.name)
    }
    if "learning_rate" in targets:
        keys.append("learning_rate")
    if "weight_decay" in targets and group.decays and _any_decays(group.mask):
        keys.append("weight_decay")
    return tuple(keys)


def _any_decays(mask: Any) -> bool:
    """Whether a group's decay mask (1 decays, 0 excluded) lets any leaf decay."""
    leaves = jax.tree.leaves(mask)
    return not leaves or any(float(np.asarray(m)) != 0.0 for m in leaves)


def _scheduled_groups(
    bound: list[BoundSchedule], name: str, groups: tuple[str, ...]
) -> set[str]:
    found: set[str] = set()
    for s in bound:
        if s.target.namespace == "opt" and s.target.name == name:
            found |= set(groups) if s.target.group is None else {s.target.group}
    return found


def _grad_rule(e: Any) -> tuple[GradRule, Callable[..., Any] | None]:
    """The gradient rule and, for the `grad_rule(self, hp)` form, the hook.

    The two-argument form is called here with a probe `hp` in which every name reads
    1.0, only to learn the rule's schedulable fields, which the schedules bind to;
    `_placed_grad_rule` then calls it with the step-0 values.
    """
    fn = _method(e, "grad_rule")
    if fn is None:
        return SingleGrad(), None
    if _takes_group(fn):  # grad_rule(self, hp): called every optimizer step
        return check_grad_rule(fn(e, _Probe(bind=_Probe()))), fn
    return check_grad_rule(fn(e)), None


class _Probe(dict[str, Any]):
    """A probe `hp` (and its "bind"): any name reads as 1.0, to learn the rule's
    type before the schedules are bound."""

    def __missing__(self, key: Hashable) -> float:
        return 1.0


def _placed_grad_rule(
    e: Any, fn: Callable[..., Any], probed: GradRule, bound: list[BoundSchedule]
) -> GradRule:
    """The setup call of `grad_rule(self, hp)`, with step 0's scheduled fields and
    bind values as the optimizer step passes them (the level-2 optimizer's setup
    probe is called the same way): the rule it returns is the one the gradient
    program bakes in, and later steps must keep its type and unscheduled fields."""
    values = {
        s.target: s.value(0) for s in bound if s.target.namespace in ("grad", "bind")
    }
    rule = check_grad_rule(fn(e, grad_rule_hp(values)))
    lost = [
        s.key
        for s in bound
        if s.target.namespace == "grad" and s.target.name not in rule.schedulable
    ]
    if lost:
        raise ConfigError(
            f"grad_rule(self, hp) returned {probed!r} when probed (every hp value "
            f"1.0) and {rule!r} with step 0's values, which has no schedulable "
            f"field for schedule `{lost[0]}`. Return a rule of one type for every "
            f"hp, or bind the value under schedules={{'bind': {{...}}}} and place it "
            f"yourself."
        )
    return rule


def anchor_checksums(plan: OptimizerPlan) -> dict[str, str]:
    """A checksum of each anchored group's anchor, for the checkpoint record."""
    return {
        g.name: anchor_checksum(g.anchor) for g in plan.groups if g.anchor is not None
    }


def check_ema(value: Any) -> EMA | None:
    """The `ema` accessor's value: None or an EMA."""
    if value is None or isinstance(value, EMA):
        return value
    raise HookError(f"ema must be None or an EMA(beta, ...); got {value!r}.")
