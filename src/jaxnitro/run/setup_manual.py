"""Manual mode at setup: whether a run trains its own step, and its optimizer states.

`manual_training()` is read once here and frozen with the handle (`Prepared.manual`).
A manual run refuses what its step cannot honour (accum > 1, a perturbing grad rule,
an EMA), warns that `train_metrics` is unused, and gets its optimizer states from
`setup_optimizers`, checked and placed on the device.
"""

from __future__ import annotations

import warnings
from typing import Any

from ..errors import (
    ConfigError,
    HookError,
    NitroWarning,
    user_stacklevel,
)
from ..experiment.hooks import has_hook, hook_function
from ..optim.manual import place_opt_states
from ..optim.plan import OptimizerPlan
from .config import RunConfig

TRAIN_METRICS_UNUSED = (
    "{cls} defines train_metrics, but it trains in manual mode (train_step), where "
    "train_metrics is unused: return the values as train_step's `stats` instead, "
    "which are logged on each train line."
)
MANUAL_ACCUM = (
    "{cls} trains in manual mode (train_step), which runs one optimizer step per "
    "batch: accum={accum} is refused, because the framework cannot split a step it "
    "does not own into micro-batches. Use accum=1 and a larger batch, or accumulate "
    "inside train_step."
)
MANUAL_PERTURB = (
    "{cls} trains in manual mode (train_step), which supports the SingleGrad "
    "grad rule only; grad_rule() returned {rule}, a perturbation rule whose second "
    "gradient pass belongs to the automatic step. Remove grad_rule, or compute the "
    "perturbed gradient inside train_step."
)
MANUAL_EMA = (
    "{cls} trains in manual mode (train_step), whose step the framework does not "
    "own, so it keeps no EMA of the parameters: ema={ema!r} is refused. Keep the "
    "average in the optimizer state inside train_step (e.g. optax.ema), or turn "
    "ema off."
)


def is_manual(e: Any) -> bool:
    """`manual_training()` of `e`, checked: a bool, and True only with a
    `train_step` to run."""
    cls = type(e)
    manual = hook_function(cls, "manual_training")(e)
    if not isinstance(manual, bool):
        raise ConfigError(
            f"manual_training() of {cls.__name__} must return a bool, got {manual!r}."
        )
    if manual and not has_hook(cls, "train_step"):
        raise HookError(
            f"manual_training() of {cls.__name__} returns True, but the class "
            f"defines no train_step(self, model, params, opt_state, state, *, "
            f"<fields>). Define it, or let manual_training() return False."
        )
    return manual


def manual_hooks(cls: type, names: list[str]) -> list[str]:
    """The runtime hooks a manual run freezes: `names` with train_step, without
    train_metrics (warned about: stats replace it)."""
    if "train_metrics" in names:
        warnings.warn(
            TRAIN_METRICS_UNUSED.format(cls=cls.__name__),
            NitroWarning,
            stacklevel=user_stacklevel(),
        )
    return [n for n in names if n != "train_metrics"] + ["train_step"]


def check_manual_config(cls: type, config: RunConfig) -> None:
    """Refuse the run settings a manual step cannot honour."""
    if config.accum != 1:
        raise ConfigError(MANUAL_ACCUM.format(cls=cls.__name__, accum=config.accum))
    if config.ema is not None:
        raise ConfigError(MANUAL_EMA.format(cls=cls.__name__, ema=config.ema))
    if config.precision != "f32":
        raise ConfigError(
            f'{cls.__name__} trains in manual mode, where precision="'
            f'{config.precision}" cannot reach the step: train_step calls its own '
            f"forward passes. Cast inside train_step (e.g. the parameters with "
            f"jax.tree.map(lambda p: p.astype(jnp.bfloat16), params)) and keep "
            f'precision="f32".'
        )


def check_manual_plan(cls: type, plan: OptimizerPlan) -> None:
    """Refuse a perturbing grad rule (SAM, ASAM): manual mode is SingleGrad only."""
    if plan.perturbs:
        rule = type(plan.grad_rule).__name__
        raise ConfigError(MANUAL_PERTURB.format(cls=cls.__name__, rule=rule))


def manual_opt_states(
    e: Any, model: Any, params: Any, state: Any, mesh: Any = None
) -> Any:
    """What `setup_optimizers` returns for the run's first weights, checked and
    placed on the device (`optim.manual.place_opt_states`); `mesh` is the run's
    `jax.sharding.Mesh` (n_devs > 1) or None."""
    hook = hook_function(type(e), "setup_optimizers")
    built = hook(e, model, params, state, mesh)
    return place_opt_states(built)
