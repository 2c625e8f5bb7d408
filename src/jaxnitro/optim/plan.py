"""`OptimizerPlan`: everything one run's optimizer step is, resolved at setup.

The plan holds the static structure (the group layout, each group's rule and whether
it decays and toward what, clipping on or off, the gradient rule's type, whether an
EMA runs), which bakes into the programs and their keys, and produces each step's
inputs on the host (learning rates with their group ratios, decay coefficients
pre-multiplied by them, scheduled rule fields, the clip threshold, the gradient rule's
fields, the EMA decay), which reach the programs as arguments and never recompile.

    eta_g(t)    = schedule(t) * learning_rate(g) / learning_rate()
    lambda_g(t) = weight_decay(g) [or its schedule] * eta_g(t)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
import optax

from ..compile.boundary import Weights
from ..compile.optimizer_step import StepInputs
from ..errors import ConfigError
from ..experiment.values import to_host_array
from .decay import Decay
from .ema import EMA, ema_update
from .grad_rules import GradRule, PerturbRule, RuleHp, SingleGrad, check_grad_rule
from .groups import GroupLayout
from .rules import RuleSpec, build_chain
from .schedules import BoundSchedule, Target


@dataclass
class GroupPlan:
    """One parameter group's optimizer, as resolved at setup.

    Attributes:
        name: the group name ("default" is first).
        rule: the group's rule (its level, constructor or factory, fields).
        lr_ratio: learning_rate(group) / learning_rate().
        weight_decay: the group's decay coefficient (before the learning rate).
        decays: whether the chain ends with Decay (coefficient non-zero or scheduled).
        anchor: what Decay pulls toward: None (zero) or a tree like the params.
        mask: the no-decay mask, 1.0 on every leaf that decays.
        scheduled: the rule fields the step feeds this group's chain as inputs:
            every one with a float default (`rules.traced_defaults`), which an
            unscheduled one takes, and any other a schedule sets.
    """

    name: str
    rule: RuleSpec
    lr_ratio: float
    weight_decay: float
    decays: bool
    anchor: Any
    mask: Any
    scheduled: tuple[str, ...] = ()

    def key(self) -> tuple[Any, ...]:
        return (
            self.name,
            self.rule.key(),
            self.decays,
            self.anchor is not None,
            self.scheduled,
        )


@dataclass
class OptimizerPlan:
    """The run's optimizer: structure baked into programs, values fed per step.

    Examples:
        >>> import jax.numpy as jnp
        >>> from jaxnitro.optim.plan import single_group_plan
        >>> plan = single_group_plan({"w": jnp.ones(2)}, learning_rate=1e-3)
        >>> sorted(plan.step_inputs(0).groups["default"])
        ['anchor', 'b1', 'b2', 'eps', 'eps_root', 'learning_rate', 'no_decay_mask',
         'weight_decay']
    """

    base_lr: float
    clip_norm: float
    layout: GroupLayout
    groups: tuple[GroupPlan, ...]
    labels: Any  # the group label of each leaf, as a tree like the params
    schedules: tuple[BoundSchedule, ...] = ()
    grad_rule: GradRule = field(default_factory=SingleGrad)
    grad_rule_fn: Callable[[Any, dict[str, Any]], Any] | None = None
    perturb_masks: dict[str, Any] | None = None
    ema: EMA | None = None
    experiment: Any = None  # the real experiment, for grad_rule(self, hp)
    # Manual mode: opt schedules bind into the experiment's own optimizer states,
    # whose subtrees expose these hyperparameters (`hyperparameters_by_subtree`).
    manual_fields: Mapping[str, tuple[str, ...]] | None = None

    def __post_init__(self) -> None:
        if not np.isfinite(self.base_lr) or self.base_lr <= 0:
            raise ConfigError(
                f"learning_rate() returned {self.base_lr!r}; it must be a finite "
                f"positive number (per-group rates are ratios against it, so 0 leaves "
                f"them undefined)."
            )
        if not np.isfinite(self.clip_norm) or self.clip_norm < 0:
            raise ConfigError(
                f"gradient_clip_norm is {self.clip_norm!r}; it must be >= 0 "
                f"(0 turns clipping off)."
            )
        self._constant = {s.target: s.value(0) for s in self.schedules if s.constant}
        self._varying = tuple(s for s in self.schedules if not s.constant)
        self._cached: StepInputs | None = None
        self._sources = {g.name: self._field_sources(g) for g in self.groups}
        # The train line's keys, resolved once: it is built on every logged step.
        self._logged = _log_keys(self._varying, self.groups, manual=self.manual)

    # --- structure ------------------------------------------------------------------
    @property
    def clips(self) -> bool:
        return self.clip_norm > 0

    @property
    def perturbs(self) -> bool:
        return isinstance(self.grad_rule, PerturbRule)

    @property
    def manual(self) -> bool:
        """Whether the run trains its own step (manual mode)."""
        return self.manual_fields is not None

    @property
    def manual_targets(self) -> tuple[tuple[str, str], ...]:
        """Manual mode's hyperparameters as `(subtree, field)`: every one the
        optimizer states expose, scheduled or not, so which keys a run schedules
        never changes the step's program; in the order `step_inputs().manual`
        holds their `(value, scheduled)` pairs."""
        return tuple(
            (subtree, name)
            for subtree, names in sorted((self.manual_fields or {}).items())
            for name in names
        )

    @property
    def is_constant(self) -> bool:
        """Whether every step's inputs are the same (no varying schedule)."""
        return not self._varying and self.grad_rule_fn is None and self.ema is None

    def constants(self) -> dict[str, Any]:
        """What the optimizer step bakes in: part of its programs' cache keys."""
        return {
            "layout": self.layout.key(),
            "groups": tuple(g.key() for g in self.groups),
            "clips": self.clips,
            "ema": self.ema is not None,
        }

    def state_layout(self) -> dict[str, Any]:
        """What the optimizer state's structure follows, for a checkpoint record.

        The group of each parameter leaf, and each group's rule and whether its chain
        ends with Decay; JSON-safe. Clipping and the EMA run outside the groups' chains
        and the step's values are inputs, so none of them is here: a run may change
        them and still restore the state.
        """
        paths = jax.tree_util.tree_flatten_with_path(self.labels)[0]
        layout: dict[str, Any] = {
            f"group of params{jax.tree_util.keystr(path)}": label
            for path, label in paths
        }
        for g in self.groups:
            layout[f"rule of group {g.name!r}"] = g.rule.describe()
            layout[f"decay in group {g.name!r}"] = g.decays
        return layout

    def gradient_constants(self) -> dict[str, Any]:
        """What the gradient computation bakes in: the gradient rule."""
        return {"grad_rule": self.grad_rule.key()}

    # --- per step -------------------------------------------------------------------
    def schedule_values(self, step: int) -> dict[Target, float]:
        values = dict(self._constant)
        for schedule in self._varying:
            values[schedule.target] = schedule.value(step)
        return values

    def step_inputs(
        self, step: int, values: dict[Target, float] | None = None
    ) -> StepInputs:
        """This optimizer step's inputs: NumPy scalars and constant device trees.

        `values`: `schedule_values(step)`, when the caller already has them.
        """
        if self._cached is not None:
            return self._cached
        if values is None:
            values = self.schedule_values(step)
        groups = {}
        for g in self.groups:
            own = self._group_values(g, values)
            hp: dict[str, Any] = {
                "learning_rate": np.float32(own["learning_rate"]),
                "weight_decay": np.float32(own["weight_decay"]) if g.decays else None,
                "anchor": g.anchor,
                "no_decay_mask": g.mask,
            }
            for name in g.scheduled:
                hp[name] = np.float32(own[name])
            groups[g.name] = hp
        manual = None
        if self.manual_targets:  # absolute values, bound into the optimizer states
            manual = tuple(
                _manual_input(values, subtree, name)
                for subtree, name in self.manual_targets
            )
        inputs = StepInputs(
            ema=None if self.ema is None else self.ema.step_inputs(step),
            grad=self.grad_inputs(step, values),
            gradient_clip_norm=np.float32(self.clip_norm) if self.clips else None,
            groups=groups,
            manual=manual,
        )
        if self.is_constant:
            self._cached = inputs
        return inputs

    def grad_inputs(self, step: int, values: dict[Target, float]) -> Any:
        """The gradient rule's per-step inputs (empty for SingleGrad), from
        `schedule_values(step)`.

        `grad_rule(self)`: the rule's fields, each scheduled one filled in by name.
        `grad_rule(self, hp)`: the fields of the rule the hook returns for this step's
        hp, which places the scheduled values itself.
        """
        if not self.perturbs and self.grad_rule_fn is None:
            return {}
        if self.grad_rule_fn is not None:
            rule = check_grad_rule(
                self.grad_rule_fn(self.experiment, grad_rule_hp(values))
            )
            # The same class object has the same code, so only the fields can
            # differ: comparing them spares fingerprinting the class every step.
            if (
                type(rule) is not type(self.grad_rule)
                or rule.baked() != self.grad_rule.baked()
            ):
                raise ConfigError(
                    f"grad_rule(self, hp) returned {rule!r} at step {step}, but it "
                    f"returned {self.grad_rule!r} at setup: the rule's type and its "
                    f"unscheduled fields bake into the gradient program and must not "
                    f"change. Vary only its schedulable fields."
                )
            own = rule.values()
        else:
            own = self.grad_rule.values()
            own.update(
                {
                    t.name: v
                    for t, v in values.items()
                    if t.namespace == "grad" and t.name in own
                }
            )
        return {
            "values": {k: np.float32(v) for k, v in own.items()},
            "masks": self.perturb_masks,
        }

    def _group_values(
        self, g: GroupPlan, values: Mapping[Target, float]
    ) -> dict[str, float]:
        """Group `g`'s rule fields this step, after the per-group scaling: the
        learning rate times the group's ratio, the decay coefficient (when it decays)
        times that rate, and each scheduled field. A group's own schedule beats one for
        every group. Runs every step of a varying schedule: which schedule sets
        each field, if any, is resolved once (`_sources`)."""
        sources = self._sources[g.name]
        lr = g.lr_ratio * float(
            self.base_lr if sources[0] is None else values[sources[0]]
        )
        own = {"learning_rate": lr}
        if g.decays:
            coefficient = g.weight_decay if sources[1] is None else values[sources[1]]
            own["weight_decay"] = float(coefficient) * lr
        defaults = dict(g.rule.defaults)
        for name, source in zip(g.scheduled, sources[2:], strict=True):
            own[name] = float(defaults[name] if source is None else values[source])
        return own

    def _field_sources(self, g: GroupPlan) -> tuple[Target | None, ...]:
        """The schedule target that sets each of group `g`'s fields (its learning
        rate, its decay coefficient, then `g.scheduled`), or None: the group's own
        beats the one for every group."""
        targets = {s.target for s in self.schedules}

        def source(name: str) -> Target | None:
            for target in (Target("opt", name, g.name), Target("opt", name)):
                if target in targets:
                    return target
            return None

        return tuple(
            source(name) for name in ("learning_rate", "weight_decay", *g.scheduled)
        )

    def scheduled_log(self, values: Mapping[Target, float]) -> dict[str, float]:
        """The varying schedule values of a step, from its `schedule_values`, under
        their log keys: a rule field as `schedule/<group>/<field>` for each group it
        reaches, after that group's scaling (as the step received it); a Device field
        as `schedule/<field>`."""
        line: dict[str, float] = {}
        groups: dict[str, dict[str, float]] = {}
        for key, (g, target) in self._logged.items():
            if g is None:
                line[key] = values[target]
                continue
            if g.name not in groups:
                groups[g.name] = self._group_values(g, values)
            line[key] = groups[g.name][target.name]
        return line

    # --- traced ---------------------------------------------------------------------
    def transformation(self, view: Any, hp: StepInputs) -> optax.GradientTransformation:
        """The Optax transformation for this step, from the traced inputs."""
        chains = {}
        for g in self.groups:
            chains[g.name] = build_chain(
                g.rule,
                view,
                g.name,
                hp.groups[g.name],
                g.scheduled,
                _decoupled if g.decays else None,
            )
        if len(self.groups) == 1:
            return chains[self.groups[0].name]
        return optax.multi_transform(chains, self.labels)

    def init_state(self, params: Any) -> Any:
        """A fresh optimizer state for `params`."""
        return self.transformation(self.experiment, self.step_inputs(0)).init(params)

    def apply(self, view: Any, weights: Weights, grads: Any, hp: StepInputs) -> Weights:
        """One optimizer step (traced): clip, each group's chain, the EMA update."""
        # Named for profiles: a trace tells the optimizer's ops apart by it.
        with jax.named_scope("optimizer"):
            return self._apply(view, weights, grads, hp)

    def _apply(
        self, view: Any, weights: Weights, grads: Any, hp: StepInputs
    ) -> Weights:
        """`apply`'s step."""
        params, opt_state, ema = weights
        if self.clips:
            grads = clip_by_global_norm(grads, hp.gradient_clip_norm)
        updates, opt_state = self.transformation(view, hp).update(
            grads, opt_state, params
        )
        params = jax.tree.map(lambda p, u: (p + u).astype(p.dtype), params, updates)
        if self.ema is not None:
            ema = ema_update(ema, params, hp.ema)
        return Weights(params, opt_state, ema)


def _log_keys(
    varying: Iterable[BoundSchedule],
    groups: tuple[GroupPlan, ...],
    *,
    manual: bool = False,
) -> dict[str, tuple[GroupPlan | None, Target]]:
    """Each varying schedule's train-line keys: one per group a rule field reaches,
    with the group that scales it, and one for any other target. In manual mode an
    opt value is logged as it binds: `schedule/<subtree>/<field>`, or
    `schedule/opt/<field>` for a bare key."""
    keys: dict[str, tuple[GroupPlan | None, Target]] = {}
    for s in varying:
        t = s.target
        if t.namespace != "opt":
            keys[t.log_key()] = (None, t)
            continue
        if manual:
            keys[t.log_key(t.group or "opt")] = (None, t)
            continue
        for g in groups:
            reaches = (
                t.name == "learning_rate"
                or t.name in g.scheduled
                or (t.name == "weight_decay" and g.decays)
            )
            if reaches and t.group in (None, g.name):
                keys[t.log_key(g.name)] = (g, t)
    return keys


def _manual_input(
    values: Mapping[Target, float], subtree: str, name: str
) -> tuple[np.float32, np.bool_]:
    """One exposed hyperparameter's manual step input, from a step's
    `schedule_values`: `(value, scheduled)`, the subtree's own schedule beating the
    bare key's; `(0, False)` where none sets it, which keeps the state's value."""
    value = values.get(Target("opt", name, subtree), values.get(Target("opt", name)))
    if value is None:
        return np.float32(0.0), np.bool_(False)
    return np.float32(value), np.bool_(True)


def grad_rule_hp(values: Mapping[Target, float]) -> RuleHp:
    """The `hp` of `grad_rule(self, hp)` for one step, from its `schedule_values`:
    each scheduled rule field by name, each bind schedule under "bind"."""
    return RuleHp(
        {t.name: v for t, v in values.items() if t.namespace == "grad"},
        {t.name: v for t, v in values.items() if t.namespace == "bind"},
    )


def scheduled_devices(
    values: Mapping[Target, float],
    fields: Iterable[tuple[Target, Any]],
    asarray: Callable[..., Any] = np.asarray,
) -> dict[str, Any]:
    """The scheduled Device fields as `{name: asarray(value, dtype)}`, from a step's
    `schedule_values` and each field's `(target, dtype)`.

    A value for an integer or bool field is checked first, as `set_device` checks
    one: a conversion would truncate 2.5 to 2 and wrap 2**40 around to 0, silently.
    """
    return {
        target.name: asarray(
            _checked(target, values[target], dtype)
            if _integral_or_bool(dtype)
            else values[target],
            dtype,
        )
        for target, dtype in fields
    }


def _integral_or_bool(dtype: Any) -> bool:
    return np.dtype(dtype).kind in "biu"


def _checked(target: Target, value: Any, dtype: Any) -> Any:
    try:
        return to_host_array(target.name, np.dtype(dtype), value)
    except ConfigError as error:
        raise ConfigError(
            f"The schedule for `{target.name}` gave it {value!r} at this step: "
            f"{error} Make the schedule return values the field's dtype holds (round "
            f"it, or clip it to the range), or make the field a float."
        ) from None


def _decoupled(values: Mapping[str, Any]) -> Any:
    """The group's decoupled decay, from its (traced) step inputs."""
    return Decay(values["weight_decay"], values["anchor"], values["no_decay_mask"])


def clip_by_global_norm(grads: Any, max_norm: Any) -> Any:
    """Scale `grads` so their global norm is at most `max_norm` (traced)."""
    clipped, _ = optax.clip_by_global_norm(max_norm).update(grads, optax.EmptyState())
    return clipped


def single_group_plan(
    params: Any, *, learning_rate: float, clip_norm: float = 0.0
) -> OptimizerPlan:
    """The level-0 plan with one group and no decay (RAdam at `learning_rate`)."""
    from .groups import group_layout, leaf_mask
    from .rules import rule_for_group

    layout = group_layout(params, None)
    mask = leaf_mask(params, lambda keypath, leaf: True, "no_decay")
    rule = rule_for_group(None, None, "default")
    group = GroupPlan(
        name="default",
        rule=rule,
        lr_ratio=1.0,
        weight_decay=0.0,
        decays=False,
        anchor=None,
        mask=mask,
        scheduled=tuple(name for name, _ in rule.defaults),
    )
    return OptimizerPlan(
        base_lr=learning_rate,
        clip_norm=clip_norm,
        layout=layout,
        groups=(group,),
        labels=layout.label_tree(params),
    )
