"""`StepCadence`: where a step-based run's events fall, in optimizer steps.

Three run keywords place events on the optimizer-step count, which runs over the
whole run (a resume included): `max_steps` ends training after its step,
`val_every_n_steps` validates after each multiple of it and
`checkpoint_every_n_steps` writes a record after each multiple of it. The hot loop
(`calls.py`) holds one integer, the next step an event falls on, ends a call there
and compares the step count with it after each call; it calls the loop's handler
only there, so a run that sets none of them pays that compare and nothing more.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

NEVER = sys.maxsize
"""The next event's step when no event is left: the step count never reaches it."""


@dataclass(frozen=True)
class StepCadence:
    """The step events of one run: each None when unset.

    Examples:
        >>> cadence = StepCadence(max_steps=10, val_every=4, checkpoint_every=6)
        >>> [cadence.next_after(s) for s in (0, 4, 6, 8, 10)]
        [4, 6, 8, 10, 9223372036854775807]
        >>> cadence.validates_at(8), cadence.checkpoints_at(8), cadence.ends_at(10)
        (True, False, True)
    """

    max_steps: int | None = None
    val_every: int | None = None
    checkpoint_every: int | None = None

    @property
    def is_empty(self) -> bool:
        """Whether no event is set (the loop then never calls its handler)."""
        return (self.max_steps, self.val_every, self.checkpoint_every) == (None,) * 3

    def next_after(self, step: int) -> int:
        """The first step after `step` an event falls on; `NEVER` when none does
        (none falls after max_steps)."""
        candidates = [
            (step // every + 1) * every
            for every in (self.val_every, self.checkpoint_every)
            if every
        ]
        first = min(candidates, default=NEVER)
        if self.max_steps is None:
            return first
        # Nothing falls after max_steps: training has ended there.
        return min(first, self.max_steps) if step < self.max_steps else NEVER

    def validates_at(self, step: int) -> bool:
        """Whether `step` is a scheduled validation step (a multiple of val_every)."""
        every = self.val_every
        return every is not None and step % every == 0

    def checkpoints_at(self, step: int) -> bool:
        """Whether `step` is a scheduled checkpoint step."""
        every = self.checkpoint_every
        return every is not None and step % every == 0

    def ends_at(self, step: int) -> bool:
        """Whether training has reached max_steps by `step`."""
        return self.max_steps is not None and step >= self.max_steps
