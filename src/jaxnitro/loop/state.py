"""`TrainState`: everything a run's training changes, as one immutable value, and
`HeldStop`: where a stop cut the state's epoch.

The handle holds the latest one (`nitro.train_state`); setup builds the first, restore
and resume return one, and the loop threads it through the programs and hands the
new one back. Nothing else holds weights: a state replaced by a step is gone (its
`Weights` and accumulator were donated to the step that replaced it).

A stop partway through an epoch leaves the state inside it: the state's `held` says
where (the batches trained, the running train loss), so training again continues
the epoch, and the record written there keeps it (`RecordHeader.epoch_loss`), so a
resume does too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..compile.boundary import Weights, owned_copy
from ..devices.placement import Placement


@dataclass(frozen=True)
class HeldStop:
    """Where a stop cut an epoch, so training again (or a resume) continues it.

    Attributes:
        epoch: the epoch the stop cut (1-based).
        step: the optimizer step the stop left the run at.
        batches: the batches of the epoch trained before the stop; None in a
            record written before it was kept (then it follows from the step).
        loss_sum: the running train loss sum of those batches.
        loss_count: how many micro-batches that sum holds.

    The checkpoint record keeps it as JSON (`RecordHeader.epoch_loss`):

    >>> held = HeldStop(2, 7, 3, 1.5, 3)
    >>> HeldStop.from_json(held.to_json()) == held
    True
    >>> HeldStop.from_json({"epoch": 2}) is None  # damaged or foreign: no stop
    True
    """

    epoch: int
    step: int
    batches: int | None
    loss_sum: float
    loss_count: int

    def to_json(self) -> dict[str, Any]:
        """The record header's form (its keys predate this type)."""
        held: dict[str, Any] = {"epoch": self.epoch, "step": self.step}
        if self.batches is not None:
            held["batches"] = self.batches
        return {**held, "sum": self.loss_sum, "count": self.loss_count}

    @classmethod
    def from_json(cls, value: Any) -> HeldStop | None:
        """The held stop a record's header carries, or None when it carries none
        (or one without the keys a continuation needs)."""
        if not isinstance(value, Mapping):
            return None
        try:
            batches = value.get("batches")
            return cls(
                int(value["epoch"]),
                int(value["step"]),
                None if batches is None else int(batches),
                float(value["sum"]),
                int(value["count"]),
            )
        except (KeyError, TypeError, ValueError):
            return None

    def is_at(self, epoch: int, step: int) -> bool:
        """Whether this stop left the run at `epoch` and `step` (it still holds)."""
        return self.epoch == epoch and self.step == step


class TrainState(NamedTuple):
    """The training state of one run.

    Not a pytree to hand to a program whole: its parts cross the program boundary
    (`compile/boundary.py`), each donated or not as a whole, and `step` and `epoch`
    are host counters, `held` a host value.

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
        held: where `epoch` stands when a stop (or max_steps, or a checkpoint
            written inside the epoch) left it unfinished at `step`, and the record
            written there keeps it; None when the epoch ended whole. It speaks for
            the state at its own step only (`HeldStop.is_at`): the steps that
            continue the epoch carry it unchanged, and the epoch's end replaces it.
    """

    weights: Weights
    model_state: Any
    accumulator: Any = None
    step: int = 0
    epoch: int = 0
    held: HeldStop | None = None

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
