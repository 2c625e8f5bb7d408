"""The optimizer the automatic loop applies, at optimizer level 0.

Level 0 is what an experiment gets by declaring nothing: RAdam at the experiment's
`learning_rate()`, one parameter group, no decay. The learning rate reaches the
optimizer program as an argument every step (a NumPy scalar), so changing it never
recompiles. Parameter groups, decay, the other optimizer levels and schedules build on
this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import optax

from ..errors import ConfigError


@dataclass(frozen=True)
class OptimizerPlan:
    """The resolved optimizer of one run: the rule and its per-step hyperparameters.

    Attributes:
        learning_rate: the base learning rate, `learning_rate()` of the experiment.
        clip_norm: the global-norm clip threshold; 0 emits no clipping ops.
    """

    learning_rate: float
    clip_norm: float

    def __post_init__(self) -> None:
        if not np.isfinite(self.learning_rate) or self.learning_rate <= 0:
            raise ConfigError(
                f"learning_rate() returned {self.learning_rate!r}; it must be a finite "
                f"positive number (per-group rates are ratios against it, so 0 leaves "
                f"them undefined)."
            )
        if not np.isfinite(self.clip_norm) or self.clip_norm < 0:
            raise ConfigError(
                f"gradient_clip_norm is {self.clip_norm!r}; it must be >= 0 "
                f"(0 turns clipping off)."
            )

    def hyperparams(self, step: int) -> dict[str, Any]:
        """This optimizer step's hyperparameters, as NumPy scalars for the program."""
        del step  # constant until schedules bind here
        return {"learning_rate": np.float32(self.learning_rate)}

    def transformation(self, hp: dict[str, Any]) -> optax.GradientTransformation:
        """The Optax rule for this step, built from the (traced) hyperparameters."""
        return optax.radam(hp["learning_rate"])

    def rule_name(self) -> str:
        """The rule's name, part of the optimizer program's cache key."""
        return "radam"


def init_state(plan: OptimizerPlan, params: Any) -> Any:
    """A fresh optimizer state for `params`."""
    return plan.transformation(plan.hyperparams(0)).init(params)


def clip_by_global_norm(grads: Any, max_norm: float) -> Any:
    """Scale `grads` so their global norm is at most `max_norm` (traced)."""
    clipped, _ = optax.clip_by_global_norm(max_norm).update(grads, optax.EmptyState())
    return clipped
