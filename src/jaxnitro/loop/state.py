"""`TrainState`: everything a run's training changes, as one immutable value.

The handle holds the latest one (`nitro.train_state`); setup builds the first, restore
and resume return one, and the loop threads it through the programs and hands the
new one back. Nothing else holds weights: a state replaced by a step is gone (its
`Weights` and accumulator were donated to the step that replaced it).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ..compile.boundary import Weights, owned_copy
from ..devices.placement import Placement


class TrainState(NamedTuple):
    """The training state of one run.

    Not a pytree to hand to a program whole: its parts cross the program boundary
    (`compile/boundary.py`), each donated or not as a whole, and `step` and `epoch`
    are host counters.

    Attributes:
        weights: params, optimizer state and EMA, donated by every optimizer step.
        model_state: the model's state (running statistics and the like), as
            `forward` last returned it; never donated.
        accumulator: accum > 1: the gradient summed over the current optimizer
            step's micro-batches (the params tree, zeros between steps), donated by
            the gradient and the optimizer programs; None at accum == 1 and before
            `train()` allocates it.
        step: optimizer steps taken.
        epoch: the current epoch, 0 before the first one begins.
    """

    weights: Weights
    model_state: Any
    accumulator: Any = None
    step: int = 0
    epoch: int = 0

    @property
    def params(self) -> Any:
        """The parameters."""
        return self.weights.params

    @property
    def opt_state(self) -> Any:
        """The optimizer state (None until `train()` allocates it)."""
        return self.weights.opt_state

    @property
    def ema(self) -> Any:
        """The EMA of the parameters (None without one)."""
        return self.weights.ema

    @classmethod
    def initial(cls, params: Any, model_state: Any) -> TrainState:
        """The state `build_model` (or a restore) starts from: own device copies,
        since the optimizer step donates (overwrites) what it is given."""
        return cls(Weights(owned_copy(params), None, None), owned_copy(model_state))

    def placed(self, placement: Placement | None) -> TrainState:
        """This state on the run's mesh: the weights and the accumulator as the
        placement lays out the training state, the model state replicated. Without
        a placement (one device) it is this state."""
        if placement is None:
            return self
        return self._replace(
            weights=placement.place(self.weights, "state"),
            model_state=placement.place(self.model_state, "replicated"),
            accumulator=placement.place(self.accumulator, "state"),
        )

    def eval_params(self, eval_weights: str) -> Any:
        """The weights evaluation, checkpoint selection, predict and export read:
        the EMA under `eval_weights="ema"` once one exists, else the parameters."""
        if eval_weights == "ema" and self.ema is not None:
            return self.ema
        return self.params

    def with_weights(self, **parts: Any) -> TrainState:
        """This state with some of `params`, `opt_state`, `ema` replaced."""
        return self._replace(weights=self.weights._replace(**parts))
