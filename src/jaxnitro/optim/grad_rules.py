"""Gradient rules: which gradient each micro-batch contributes.

`SingleGrad` (the default) takes one forward and backward pass. A `PerturbRule` takes
the gradient at perturbed parameters `params + eps`, where `eps` comes from the
unperturbed gradient: two passes per micro-batch, the second one's gradient
accumulated; the reported loss, state and train_metrics are the first pass's.

    SAM:  eps = rho * g / ||g||                      (Foret et al. 2021)
    ASAM: eps = rho * T^2 g / ||T g||,  T = |w| + eta (Kwon et al. 2021)

Leaves `no_perturb` excludes get eps = 0 and stay out of the norm; under ASAM, leaves
`adaptive_perturb` declines (rank 1 and below by default) get T = 1. A rule's
schedulable fields (rho) reach the program as inputs every step, so changing them
never recompiles; the rule's class (its code included) and its other fields bake in.
A custom rule may be a dataclass or a plain class, whose instance attributes are its
fields.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from ..errors import ConfigError, NotYetSupportedError
from ..keys.fingerprint import fingerprint

_TINY = 1e-12


class GradRule:
    """The supertype of what `grad_rule` returns."""

    schedulable: tuple[str, ...] = ()

    def values(self) -> dict[str, float]:
        """The schedulable fields' host values, which the program receives."""
        return {name: float(getattr(self, name)) for name in self.schedulable}

    def baked(self) -> tuple[tuple[str, Any], ...]:
        """The unscheduled fields, which the program bakes in: a dataclass's fields,
        or a plain class's instance attributes."""
        if dataclasses.is_dataclass(self):
            names = [f.name for f in dataclasses.fields(self)]
        else:
            names = sorted(getattr(self, "__dict__", {}))
        return tuple(
            (name, getattr(self, name))
            for name in names
            if name not in self.schedulable
        )

    def key(self) -> tuple[Any, ...]:
        """What bakes into the gradient program: the class and the unscheduled fields.

        The class counts by its code as well as its name: two rules can share a
        qualname (a notebook redefinition, a class made in a factory) and trace
        different perturbations.
        """
        cls = type(self)
        return (cls.__module__, cls.__qualname__, fingerprint(cls), self.baked())


@dataclass(frozen=True)
class SingleGrad(GradRule):
    """One forward and backward pass per micro-batch (the default)."""


class PerturbRule(GradRule):
    """A rule that takes the gradient at `params + perturbation(...)`."""

    def perturbation(
        self, grads: Any, params: Any, masks: dict[str, Any], values: dict[str, Any]
    ) -> Any:
        """The perturbation eps, traced; `values` holds this step's rule fields."""
        raise NotImplementedError


def _global_norm(tree: Any) -> Any:
    return jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(tree)))


def _check_rho(rule: str, rho: Any, m: Any) -> None:
    if not float(rho) >= 0:
        raise ConfigError(f"{rule}(rho) must be >= 0, got {rho!r}.")
    if m is not None:
        raise NotYetSupportedError(
            f"{rule}(m=...) (m-sharpness) is reserved and not supported yet; leave it "
            f"unset."
        )


@dataclass(frozen=True)
class SAM(PerturbRule):
    """Sharpness-aware minimization: the gradient at params + rho * g / ||g||."""

    rho: float
    m: int | None = None
    schedulable = ("rho",)

    def __post_init__(self) -> None:
        _check_rho("SAM", self.rho, self.m)

    def perturbation(
        self, grads: Any, params: Any, masks: dict[str, Any], values: dict[str, Any]
    ) -> Any:
        gated = jax.tree.map(lambda g, m: g * m, grads, masks["perturb"])
        scale = values["rho"] / (_global_norm(gated) + _TINY)
        return jax.tree.map(lambda g: (scale * g).astype(g.dtype), gated)


@dataclass(frozen=True)
class ASAM(PerturbRule):
    """Adaptive SAM: eps = rho * T^2 g / ||T g|| with T = |w| + eta per leaf."""

    rho: float
    eta: float = 0.01
    m: int | None = None
    schedulable = ("rho",)

    def __post_init__(self) -> None:
        _check_rho("ASAM", self.rho, self.m)
        if not float(self.eta) >= 0:
            raise ConfigError(f"ASAM(eta) must be >= 0, got {self.eta!r}.")

    def perturbation(
        self, grads: Any, params: Any, masks: dict[str, Any], values: dict[str, Any]
    ) -> Any:
        def size(w: Any, adaptive: Any) -> Any:
            return jnp.where(adaptive > 0, jnp.abs(w) + self.eta, jnp.ones_like(w))

        t = jax.tree.map(size, params, masks["adaptive"])
        gated = jax.tree.map(lambda g, m: g * m, grads, masks["perturb"])
        tg = jax.tree.map(lambda a, g: a * g, t, gated)
        scale = values["rho"] / (_global_norm(tg) + _TINY)
        return jax.tree.map(lambda a, g: (scale * a * a * g).astype(g.dtype), t, gated)


class RuleHp(dict[str, Any]):
    """What `grad_rule(self, hp)` receives for one optimizer step: each scheduled
    field of the rule by name and each `bind` schedule under `hp["bind"]`, all host
    numbers (floats). Reading a name no schedule sets raises a ConfigError naming it
    and the fix, not a bare KeyError; `hp.get(name, default)` reads it optionally.

    Examples:
        >>> hp = RuleHp({"rho": 0.05}, {"sam_warm": 0.5})
        >>> hp["rho"] * hp["bind"]["sam_warm"], hp.get("eta", 0.01)
        (0.025, 0.01)
    """

    def __init__(self, fields: dict[str, float], bind: dict[str, float]) -> None:
        super().__init__(fields)
        self["bind"] = _BindHp(bind)

    def __missing__(self, key: Any) -> Any:
        held = ", ".join(k for k in self if k != "bind") or "no rule field"
        raise ConfigError(
            f"grad_rule(self, hp) read hp[{key!r}], but no schedule sets the rule "
            f"field `{key}` (hp holds {held}, and bind). Schedule it if it is a "
            f"schedulable field of the rule, e.g. schedules={{'grad': {{{key!r}: "
            f"...}}}}; put a value of your own under schedules={{'bind': {{...}}}} "
            f"and read hp['bind'][name]; or read it with hp.get({key!r}, default)."
        )


class _BindHp(dict[str, Any]):
    """`hp["bind"]`: the bind schedules' values by name."""

    def __missing__(self, key: Any) -> Any:
        raise ConfigError(
            f"grad_rule(self, hp) read hp['bind'][{key!r}], but no schedule binds "
            f"`{key}` (bound: {', '.join(self) or 'none'}). Schedule it, e.g. "
            f"schedules={{'bind': {{{key!r}: lambda total: lambda t: ...}}}}, or "
            f"read it with hp['bind'].get({key!r}, default)."
        )


def check_grad_rule(rule: Any) -> GradRule:
    """Refuse what is not a GradRule, naming the ones there are, and a rule whose
    baked fields cannot enter a cache key."""
    if not isinstance(rule, GradRule):
        raise ConfigError(
            f"grad_rule returned {rule!r}; it must be a GradRule: SingleGrad(), "
            f"SAM(rho) or ASAM(rho, eta)."
        )
    for name, value in rule.baked():
        try:
            hash(value)
        except TypeError:
            raise ConfigError(
                f"grad_rule returned {type(rule).__name__} with field `{name}` = "
                f"{value!r}, which is not hashable. A rule's unscheduled fields bake "
                f"into the gradient program and key it, so they must be host values "
                f"such as numbers, strings and tuples."
            ) from None
    return rule
