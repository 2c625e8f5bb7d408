"""`OptimizerStep`: what a training program traces of the optimizer.

The train program (`programs.gradient_fn`, `scanned.automatic_step`) differentiates
the loss, takes a second gradient under a perturbation rule (SAM, ASAM), and applies
one optimizer step to the `Weights`. It needs three things of the optimizer, and
this protocol names them, so that `compile/` depends on no optimizer class:
`optim.plan.OptimizerPlan` is the one implementation, built by `optim/` (a layer
above this one) and handed to the programs by the run's setup.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

from .boundary import Weights


class StepInputs(NamedTuple):
    """One optimizer step's inputs, made on the host each step (`hp`).

    The fields are in the order of their names, the order a dict of them flattens
    in: the leaves, so the compiled programs, are those of the dict this replaced.

    Attributes:
        ema: the EMA's update inputs (`{"decay": float32, "update": bool_}`), or
            None without an EMA.
        grad: the gradient rule's inputs (`{"values": {field: float32}, "masks":
            tree}`), `{}` for a rule that takes none.
        gradient_clip_norm: float32, the global-norm threshold; None without
            clipping.
        groups: each group's hyperparameters by group name, as the group's
            `optimizer(self, group, hp)` reads them (`hp["learning_rate"]`, ...).
        manual: manual mode's `(value, scheduled)` of each exposed optimizer
            field, in `OptimizerPlan.manual_targets` order; None otherwise.
    """

    ema: Any
    grad: Any
    gradient_clip_norm: Any
    groups: dict[str, dict[str, Any]]
    manual: tuple[Any, ...] | None


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

    def apply(self, view: Any, weights: Weights, grads: Any, hp: StepInputs) -> Weights:
        """One optimizer step (traced): `weights` moved by `grads` under this
        step's hyperparameters `hp`, as new `Weights`."""
        ...
