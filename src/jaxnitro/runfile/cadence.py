"""Steps and cadence onto the engine's epochs: one place, so it can move to max_steps.

The engine counts epochs. A run file counts optimizer steps and does its logging,
evaluation and checkpointing every `cadence` steps. So one engine epoch is one
cadence block: `cadence` optimizer steps, `cadence * microbatches` batches drawn
from the endless record stream, and `ceil(steps / cadence)` epochs, the last one
shorter when `cadence` does not divide `steps`. Validation and checkpoints run
after each epoch, so they land on cadence boundaries (and after the last step).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CadencePlan:
    """A run's steps as engine epochs.

    Examples:
        >>> plan = cadence_plan(steps=5, cadence=2, microbatches=2)
        >>> plan.epochs, plan.steps_per_epoch, plan.batches_per_epoch
        (3, (2, 2, 1), (4, 4, 2))
    """

    steps: int
    cadence: int
    microbatches: int
    steps_per_epoch: tuple[int, ...]

    @property
    def epochs(self) -> int:
        """The engine's `max_epochs`."""
        return len(self.steps_per_epoch)

    @property
    def batches_per_epoch(self) -> tuple[int, ...]:
        """Each epoch's micro-batches (what the train split's `len()` says)."""
        return tuple(s * self.microbatches for s in self.steps_per_epoch)


def cadence_plan(*, steps: int, cadence: int, microbatches: int) -> CadencePlan:
    """`steps` optimizer steps in blocks of `cadence`, the last block shorter."""
    full, rest = divmod(steps, cadence)
    blocks = (cadence,) * full + ((rest,) if rest else ())
    return CadencePlan(steps, cadence, microbatches, blocks)
