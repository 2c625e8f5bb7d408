"""An epoch's batches grouped into blocks, on the consumer or on a prefetch thread.

The calls loop (`calls.py`) runs its calls over blocks: the batches of up to
`size` optimizer steps, stacked into one value per field (`blocks.py`). Here the
batches of a pass are numbered, checked and grouped into those blocks, by one
`BlockAssembler` per epoch:

- on the consumer's thread (`add`, then `finish`), where the pass is read there (a
  list of built batches, `NoPrefetch`), on a CPU backend at one step a call, and
  across processes: the loop stacks and places each block itself, deciding per
  block whether a call reads it whole (`calls.py`);
- on the prefetch pass's one in-order thread (the fan-out's transfer thread, or
  the single producer: `open_feed(assembler=...)`), where the pass has threads of
  its own: the thread also stacks the block and, on an accelerator, starts its
  copy, so the consumer is handed one staged block per `size` steps
  (a hand-off between threads cost a TPU host more than a tutorial step, and a
  hand-off per batch made the threaded paths 0.54x-0.58x of batches already on the
  device: issue 26, item 7). The thread does not wait for the copy
  (`data/transfer.py` says why: while it did, on the TPU the threaded paths fell to
  0.29x-0.33x of batches on the device, the loader fan-out's data_wait_frac from 4%
  to 57%, GPT-2's from 0% to 29%, 2026-12-06). Such a
  pass holds up to `device_batches + 2` blocks on the device: one in the channel per
  `device_batches`, one in the thread's hand, one in the consumer's.

Either way the blocks are the same: a block holds `size` steps, fewer at the
epoch's end (and where a source ran short, its whole steps); the batches a resumed
epoch already trained are read and passed over, counted in `delivered`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..data.prefetch import routed_fields
from ..data.signature import batch_signature
from ..data.transfer import transfer
from .accumulation import Accumulation
from .blocks import (
    CPU_DIRECT_BATCH_BYTES,
    DIRECT_BATCH_BYTES,
    block_steps,
    host_bytes,
    refuse_changed,
    stacked_block,
)
from .host_buffers import HostBuffers
from .step_programs import check_batch


@dataclass(frozen=True)
class BlockPlan:
    """What the epoch's first trained batch fixed: the epoch's batch count, the
    routed fields' shapes and dtypes, the steps a block holds."""

    count: int
    signature: Any
    size: int


class Block(NamedTuple):
    """The batches of up to `plan.size` optimizer steps."""

    batches: list[tuple[Mapping[str, Any], dict[str, Any], int]]
    """Each micro-batch in order: (the source's batch, its routed fields, index)."""
    steps: int
    plan: BlockPlan
    delivered: int
    """The batches the pass delivered up to this block's last, skipped ones too."""
    stacked: dict[str, Any] | None = None
    """The block stacked (`stacked_block`), and placed on an accelerator, by the
    prefetch thread that assembled it; None: the consumer stacks it."""

    @property
    def device(self) -> Any:
        """What the stream's ledger frees once the block is released."""
        return {} if self.stacked is None else self.stacked

    @property
    def host(self) -> tuple[()]:
        return ()


class PassEnd(NamedTuple):
    """After the last block: the batches the pass delivered in all."""

    delivered: int

    @property
    def device(self) -> dict[str, Any]:
        return {}


@dataclass(frozen=True)
class BlockSettings:
    """How an epoch's blocks are cut and, when a thread stages them, placed."""

    fields: tuple[str, ...]  # the routed fields
    expected: int  # a batch's rows
    epoch: int  # 1-based, for the messages
    skip: int  # batches a stopped run already trained this epoch
    accum: int
    per_call: int  # the epoch's steps_per_call
    on_device: bool  # batches are worth staging on the device (an accelerator)
    sharding: Any = None  # where a staged block goes (a mesh's block sharding)


class BlockAssembler:
    """One epoch's batches, numbered, checked and grouped into `Block`s.

    On the consumer: `add(host, routed)` per batch, then `finish()`. As a prefetch
    pass's `prepare` (its in-order thread): called with each host batch, it routes
    the batch itself and stacks (and on an accelerator places) each block it
    completes; `finish()` at the pass's end. Either way `finish()` ends with a
    `PassEnd`.
    """

    def __init__(
        self,
        settings: BlockSettings,
        source: Any,
        stages: bool,
        buffers: HostBuffers | None = None,
    ) -> None:
        self.settings = settings
        self.source = source
        self.stages = stages  # stack (and place) each block here: a prefetch thread
        self.buffers = buffers  # the train()'s stacking buffers
        self.plan: BlockPlan | None = None
        self.index = 0  # the next batch's index in the epoch
        self.reading: list[tuple[Mapping[str, Any], dict[str, Any], int]] = []
        self.block = 0  # the steps of the block being read

    def __call__(self, host: Mapping[str, Any]) -> list[Block]:
        """A prefetch thread's prepare: one host batch in, the block it completed
        (if any) out, stacked and placed."""
        s = self.settings
        block = self.add(host, routed_fields(host, s.fields, "train"))
        return [] if block is None else [block]

    def add(self, host: Mapping[str, Any], routed: dict[str, Any]) -> Block | None:
        """Take the pass's next batch; the block it completes, if any."""
        s, index = self.settings, self.index
        self.index = index + 1
        check_batch(routed, s.fields, s.expected, index, s.epoch)
        if index < s.skip:  # trained before a stop: the epoch goes on after it
            return None
        plan = self.plan
        if plan is None:  # the epoch's first trained batch
            plan = self.plan = self._draw(routed)
        if not self.reading:
            self.block = min(plan.size, max((plan.count - index) // s.accum, 1))
        self.reading.append((host, routed, index))
        if len(self.reading) < self.block * s.accum:
            return None
        return self._complete(self.block)

    def finish(self) -> list[Block | PassEnd]:
        """At the pass's end: the whole steps of a source that ran short, then the
        batches delivered in all."""
        whole = len(self.reading) // self.settings.accum
        done: list[Block | PassEnd] = []
        if whole:
            self.reading = self.reading[: whole * self.settings.accum]
            done.append(self._complete(whole))
        self.reading = []
        done.append(PassEnd(self.index))
        return done

    def _draw(self, routed: dict[str, Any]) -> BlockPlan:
        s = self.settings
        count = len(self.source)
        if s.accum > 1:
            Accumulation(s.accum).refuse_epoch(count, s.epoch)
        batch_bytes = host_bytes(routed) * s.accum
        size = block_steps(s.per_call, batch_bytes)
        direct = DIRECT_BATCH_BYTES if s.on_device else CPU_DIRECT_BATCH_BYTES
        if s.per_call == 1 and batch_bytes >= direct:
            # The executable takes each host batch as it is (a view) and transfers
            # it itself: a large batch's stack costs more than the transfers it
            # saves (on a CPU, more than the conversion of its host arrays).
            size = 1
        # Never more steps than the epoch holds: a one-batch epoch (a first step)
        # reads its batch as it is, and an epoch shorter than steps_per_call is one
        # block of its own length, with no padding (a short block's padding is a
        # program, compiled for each short length: 0.24 s of a TPU first step).
        size = min(size, max(count // s.accum, 1))
        return BlockPlan(count, batch_signature(routed), size)

    def staged(self, block: Block) -> Block:
        """`block` stacked and, on an accelerator, its copy started, as this
        assembler's thread would have handed it (`loop/read_ahead.py`)."""
        return block._replace(stacked=self._stacked(block.batches, block.steps))

    def _complete(self, steps: int) -> Block:
        reading, self.reading = self.reading, []
        assert self.plan is not None
        stacked = self._stacked(reading, steps) if self.stages else None
        return Block(reading, steps, self.plan, reading[-1][2] + 1, stacked)

    def _stacked(self, reading: list[Any], steps: int) -> dict[str, Any]:
        """The block stacked, and on an accelerator its copy started (a block cut
        short padded on the device)."""
        s = self.settings
        assert self.plan is not None
        size = self.plan.size
        try:
            stacked = stacked_block(
                [r for _, r, _ in reading],
                steps,
                s.accum,
                size,
                pad_host=not s.on_device,
                buffers=self.buffers,
            )
        except ValueError:  # fields of several shapes do not stack
            refuse_changed(reading, self.plan.signature, s.epoch)
            raise
        if not s.on_device:
            return stacked
        return transfer(stacked, s.sharding, rows=size)
