"""`Accumulation`: how many micro-batches one optimizer step takes, and what follows.

With accum = N each optimizer step adds the gradients of N micro-batches (batches of
the train split) before the optimizer applies them. Everything that depends on N is
here, once: the steps an epoch of B batches makes (B // N), the samples a step takes,
and the three refusals of a batch count N does not divide (at setup, at an epoch's
start, and where a stop cut an epoch), each naming the counts and the fix.

    >>> acc = Accumulation(4)
    >>> acc.steps(100), acc.batches(25), acc.samples(32)
    (25, 100, 128)
    >>> acc.refuse_split(10)
    Traceback (most recent call last):
    ...
    jaxnitro.errors.ConfigError: The train split has 10 batches, which does not ...
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError

SPLIT_ACCUM = (
    "The train split has {count} batches, which does not divide by accum={accum} "
    "({count} % {accum} = {rest}): every optimizer step takes {accum} "
    "micro-batches. Change the batch size or accum so the batch count divides."
)
EPOCH_ACCUM = (
    "The train split has {count} batches in epoch {epoch} (len() read after the "
    "epoch's plan was drawn), which does not divide by accum={accum} ({count} % "
    "{accum} = {rest}): every optimizer step takes {accum} micro-batches, and the "
    "last {rest} would carry their gradient into the next epoch. Keep each epoch's "
    "batch count a multiple of accum (have begin_epoch drop the extra batches), or "
    "change accum or the batch size so it divides."
)
STOPPED_ACCUM = (
    "The run stopped {count} batches into epoch {epoch}, which accum={accum} does "
    "not divide: the rest of the epoch cannot be cut into optimizer steps of "
    "{accum} micro-batches the way the stopped run was. Continue it with an accum "
    "that divides {count}, or with the accum it was trained with."
)


@dataclass(frozen=True)
class Accumulation:
    """Micro-batches per optimizer step (the run keyword `accum`, at least 1)."""

    micro_batches: int

    def steps(self, batches: int) -> int:
        """The optimizer steps `batches` micro-batches make (whole steps)."""
        return batches // self.micro_batches

    def batches(self, steps: int) -> int:
        """The micro-batches `steps` optimizer steps take."""
        return steps * self.micro_batches

    def samples(self, batch: int) -> int:
        """The samples one optimizer step takes at micro-batches of `batch`."""
        return batch * self.micro_batches

    def refuse_split(self, count: int) -> None:
        """At setup: refuse a train split of `count` batches it does not divide."""
        self._refuse(SPLIT_ACCUM, count)

    def refuse_epoch(self, count: int, epoch: int) -> None:
        """At an epoch's start (its plan drawn): refuse `count` batches it does not
        divide, before any trains (the rest would carry into the next epoch)."""
        self._refuse(EPOCH_ACCUM, count, epoch=epoch)

    def refuse_stopped(self, count: int, epoch: int) -> None:
        """On continuing an epoch a stop cut after `count` batches: refuse a count
        it does not divide (a run continued with another accum)."""
        self._refuse(STOPPED_ACCUM, count, epoch=epoch)

    def _refuse(self, message: str, count: int, **where: int) -> None:
        accum = self.micro_batches
        if count % accum:
            raise ConfigError(
                message.format(count=count, accum=accum, rest=count % accum, **where)
            )
