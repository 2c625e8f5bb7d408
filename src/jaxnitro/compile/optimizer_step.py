"""`OptimizerStep`: what a training program traces of the optimizer.

The train program (`programs.gradient_fn`, `scanned.automatic_step`) differentiates
the loss, takes a second gradient under a perturbation rule (SAM, ASAM), and applies
one optimizer step to the `Weights`. It needs three things of the optimizer, and
this protocol names them, so that `compile/` depends on no optimizer class:
`optim.plan.OptimizerPlan` is the one implementation, built by `optim/` (a layer
above this one) and handed to the programs by the run's setup.
"""

from __future__ import annotations

from typing import Any, Protocol

from .boundary import Weights


class OptimizerStep(Protocol):
    """The optimizer as a training program traces it."""

    @property
    def perturbs(self) -> bool:
        """Whether the gradient rule takes a second gradient at perturbed params."""
        ...

    @property
    def grad_rule(self) -> Any:
        """The gradient rule; when `perturbs`, it has `perturbation(grads, params,
        masks, values) -> eps`, a tree like the params."""
        ...

    def apply(
        self, view: Any, weights: Weights, grads: Any, hp: dict[str, Any]
    ) -> Weights:
        """One optimizer step (traced): `weights` moved by `grads` under this
        step's hyperparameters `hp`, as new `Weights`."""
        ...
