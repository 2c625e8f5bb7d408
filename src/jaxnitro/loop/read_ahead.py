"""The next epoch's first block, staged while this epoch ends.

Between two epochs the device idles: the epoch's last losses are read back, the
epoch ends on the host (its lines, the history row, validation, the checkpoint),
and the next epoch's first block is stacked and copied before its first call can
run. On a TPU v5e a compute-bound MLP's block of 8 batches is 6.4 MB, about 2.6 ms
of stack and copy (3.2 MB measured 1.3 ms) in an epoch the hand-written scan runs
in 4.3 ms and jaxnitro ran in 7.8 ms at steps_per_call=8 (2026-12-06). So where it
is safe the calls loop stages that block as soon as the epoch's last call is
dispatched: its stack overlaps the last calls, its copy the read-back and the
epoch's end, and the next epoch starts with it on the device.

Safe where reading the next epoch's first batches early reads what the next epoch
would read: a list of built batches (the same batches every epoch, read on the
loop's thread: no prefetch thread runs ahead), in one process, with batches staged
on an accelerator, no `on_epoch_end` hook (one could change the data), the steps
a call takes known (not "auto" still measuring) and an epoch to come; the run
decides the hook and the count (`run/training.py`), the epoch the rest
(`steps.py`). The next epoch takes the block only if it reads the same split with
the same block settings, else the pass read ahead is closed and the epoch reads its
batches again; one that no epoch takes (the run stopped after the epoch) is closed
at the `train()`'s end. So is one whose list changed meanwhile (its length, or one
of the first block's batches replaced), which only code outside a hook could do (a
logger, another thread); an array written in place is not seen, as a batch a
prefetch thread staged is not. A batch the pass read ahead that the epoch would
refuse (another batch size, a field missing) is not refused early: the pass is
dropped and the epoch refuses it in its own turn.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..data.protocol import unwrap_source
from ..data.stream import InlinePass
from ..experiment.routing import as_batch
from .assembly import Block, BlockAssembler, BlockSettings, PassEnd


@dataclass
class AheadBlock:
    """An epoch's pass opened early, with its first block staged.

    Attributes:
        epoch: the epoch it is for (1-based).
        source: the train split it reads.
        feed: the pass, past the first block's batches.
        assembler: the epoch's assembler, past the first block.
        items: the first block (placed: `Block.stacked`), and the pass's end if
            the pass held no more.
        length: how many batches the list held when the pass began.
    """

    epoch: int
    source: Any
    feed: InlinePass
    assembler: BlockAssembler
    items: list[Block | PassEnd]
    length: int

    @property
    def settings(self) -> BlockSettings:
        return self.assembler.settings

    def read_from(self, source: Any) -> bool:
        """Whether `source` still holds what the pass read: as many batches, the
        first block's the same objects (a batch that is no mapping, such as a named
        tuple, the same arrays)."""
        batches = unwrap_source(source)
        if len(batches) != self.length:
            return False
        for item in self.items:
            if not isinstance(item, Block):
                continue
            for host, _, index in item.batches:
                if not _same_batch(batches[index], host):
                    return False
        return True


def _same_batch(now: Any, read: Mapping[str, Any]) -> bool:
    """Whether the list's batch `now` is the batch the pass `read` (the same object,
    or for a batch that is no mapping, one whose fields are the same arrays)."""
    if now is read:
        return True
    if isinstance(now, Mapping):
        return False
    try:
        fields = as_batch(now, "")
    except Exception:  # not a batch any more: the epoch refuses it in its turn
        return False
    return len(fields) == len(read) and all(
        value is read.get(name) for name, value in fields.items()
    )


class ReadAhead:
    """One `train()`'s block read ahead: at most one held at a time.

    >>> ahead = ReadAhead()
    >>> ahead.take(2, source=[], settings=None) is None, ahead.taken
    (True, 0)
    """

    def __init__(self) -> None:
        self._held: AheadBlock | None = None
        self.taken = 0  # epochs that started from a block read ahead
        self.dropped = 0  # blocks read ahead that no epoch took

    def put(self, ahead: AheadBlock) -> None:
        """Hold `ahead` (dropping one held before)."""
        self.close()
        self._held = ahead

    def take(self, epoch: int, source: Any, settings: Any) -> AheadBlock | None:
        """The block read ahead for `epoch` of `source` cut by `settings`, or None
        (one held for anything else is closed)."""
        held, self._held = self._held, None
        if held is None:
            return None
        if (
            held.epoch == epoch
            and held.source is source
            and held.settings == settings
            and held.read_from(source)
        ):
            self.taken += 1
            return held
        held.feed.close()
        self.dropped += 1
        return None

    def close(self) -> None:
        """Close the pass of a block no epoch took."""
        held, self._held = self._held, None
        if held is not None:
            held.feed.close()
            self.dropped += 1


def read_first_block(
    epoch: int, source: Any, feed: InlinePass, assembler: BlockAssembler
) -> AheadBlock | None:
    """`epoch`'s pass `feed` read up to its first block, which is stacked and placed
    as a prefetch thread would (`BlockAssembler.staged`); None, with the pass
    closed, where reading it raised (the epoch reads it again and raises then)."""
    items: list[Block | PassEnd] = []
    length = len(unwrap_source(source))
    try:
        for full, routed in feed:
            block = assembler.add(full, routed)
            if block is not None:
                items.append(assembler.staged(block))
                break
        else:
            items = [
                assembler.staged(item) if isinstance(item, Block) else item
                for item in assembler.finish()
            ]
    except Exception:
        feed.close()
        return None
    return AheadBlock(epoch, source, feed, assembler, items, length)
