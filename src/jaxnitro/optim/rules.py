"""The optimizer the automatic loop applies, at optimizer level 0.

Level 0 is what an experiment gets by declaring nothing: RAdam at the experiment's
`learning_rate()`, one parameter group, no decay, and global-norm clipping of the
gradient when `gradient_clip_norm` is above 0. The learning rate and the clip threshold
reach the program as arguments every step (NumPy scalars), so changing either never
recompiles; only switching clipping on or off does, since 0 emits no clipping ops at
all. Parameter groups, decay, the other optimizer levels and schedules build on this
module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
import optax

from ..errors import ConfigError


@dataclass(frozen=True)
class OptimizerPlan:
    """The resolved optimizer of one run: the rule and its per-step hyperparameters.

    Attributes:
        learning_rate: the base learning rate, `learning_rate()` of the experiment.
        clip_norm: the global-norm clip threshold; 0 emits no clipping ops.

    Example:
        >>> plan = OptimizerPlan(learning_rate=1e-3, clip_norm=1.0)
        >>> sorted(plan.hyperparams(0)), plan.constants()
        (['gradient_clip_norm', 'learning_rate'], {'rule': 'radam', 'clips': True})
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

    @property
    def is_constant(self) -> bool:
        """Whether the hyperparameters are the same at every step (no schedule)."""
        return True

    @property
    def clips(self) -> bool:
        """Whether the program clips at all (a baked constant)."""
        return self.clip_norm > 0

    def hyperparams(self, step: int) -> dict[str, Any]:
        """This optimizer step's hyperparameters, as NumPy scalars for the program."""
        del step  # constant until schedules bind here
        hp = {"learning_rate": np.float32(self.learning_rate)}
        if self.clips:
            hp["gradient_clip_norm"] = np.float32(self.clip_norm)
        return hp

    def constants(self) -> dict[str, Any]:
        """What the optimizer step bakes in: part of its program's cache key."""
        return {"rule": "radam", "clips": self.clips}

    def transformation(self, hp: dict[str, Any]) -> optax.GradientTransformation:
        """The Optax rule for this step, built from the (traced) hyperparameters."""
        return optax.radam(hp["learning_rate"])

    def apply(self, params: Any, opt_state: Any, grads: Any, hp: dict[str, Any]) -> Any:
        """One optimizer step (traced): clip, the rule, the update.

        Returns `(params, opt_state)`.
        """
        if self.clips:
            grads = clip_by_global_norm(grads, hp["gradient_clip_norm"])
        updates, opt_state = self.transformation(hp).update(grads, opt_state, params)
        params = jax.tree.map(lambda p, u: (p + u).astype(p.dtype), params, updates)
        return params, opt_state


def init_state(plan: OptimizerPlan, params: Any) -> Any:
    """A fresh optimizer state for `params`."""
    return plan.transformation(plan.hyperparams(0)).init(params)


def clip_by_global_norm(grads: Any, max_norm: Any) -> Any:
    """Scale `grads` so their global norm is at most `max_norm` (traced)."""
    clipped, _ = optax.clip_by_global_norm(max_norm).update(grads, optax.EmptyState())
    return clipped
