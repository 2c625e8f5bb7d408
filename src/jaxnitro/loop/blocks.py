"""A block: the batches of several optimizer steps, stacked into one value per field.

The calls loop (`calls.py`) reads a block of steps' batches from the feed, stacks
each routed field into `(K, B, ...)` (or `(K, accum, B, ...)` under accumulation)
and places the stack with one transfer, which the block's calls then read by
position. Here: how many steps a block holds, the stack itself, and the refusal of
a block whose batches changed a field's shape or dtype.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from ..data.signature import changed_field
from ..errors import ConfigError

BLOCK_STEPS = 8
"""The fewest steps a staged block holds: at steps_per_call=1 a block of 8 batches is
placed with one transfer and read by 8 calls (a separate transfer per batch cost a
TPU step 150-300 us, more than the step itself)."""
DIRECT_BATCH_BYTES = 512 * 2**10
"""At steps_per_call=1 a step's batches of at least this many bytes go to the
executable as they are, one transfer a step, not stacked into blocks: on a TPU v5e
host blocks took a 314 KB tutorial batch from 0.99x to 1.15x of the hand-written
loop, but an 800 KB one from 0.90x down to 0.71x (the stack's copy outweighs the
transfers it saves)."""
BLOCK_BYTES = 256 * 2**20
"""A block holds fewer than BLOCK_STEPS batches (down to steps_per_call) where that
many would pass this many bytes on the device."""


def block_steps(per_call: int, batch_bytes: int) -> int:
    """The steps a staged block holds: at least `per_call`, up to `BLOCK_STEPS`
    while the block stays under `BLOCK_BYTES`.

    >>> block_steps(1, 1000), block_steps(16, 1000), block_steps(2, 100 * 2**20)
    (8, 16, 2)
    """
    fits = max(1, BLOCK_BYTES // max(batch_bytes, 1))
    return max(per_call, min(BLOCK_STEPS, fits))


def stacked_block(
    routed: list[dict[str, Any]],
    steps: int,
    accum: int,
    size: int,
    pad_host: bool = True,
) -> dict[str, Any]:
    """A block's routed batches as one: each field `(size, B, ...)`, or `(size,
    accum, B, ...)` under accumulation (one host copy per field; a field whose
    batches are all device arrays is stacked on the device); a block of fewer than
    `size` steps is padded with its last batch, which no call reaches. Without
    `pad_host` its host fields hold only its own `steps`: the block is about to be
    placed with `transfer(..., rows=size)`, which pads them on the device, so the
    transfer carries no padding (on a TPU host a compute-bound MLP's 4-step tail
    padded to 8 sent 3.2 MB more, about 1.3 ms of a 6 ms epoch).

    Raises ValueError when a field's batches differ in shape or dtype."""
    if size == steps == accum == 1:  # a view of the one batch: no copy
        return {name: np.asarray(value)[None] for name, value in routed[0].items()}
    out = {}
    for name in routed[0]:
        arrays = [batch[name] for batch in routed]
        on_device = all(isinstance(a, jax.Array) for a in arrays)
        if not on_device:
            arrays = [np.asarray(a) for a in arrays]
        if len({a.dtype for a in arrays}) > 1:  # a stack would promote them
            raise ValueError(f"field {name} holds several dtypes")
        pad = (size - steps) * accum if on_device or pad_host else 0
        stack: Any = (  # a field on the device already stays there
            jax.numpy.stack(arrays + arrays[-1:] * pad)
            if on_device
            else np.stack(arrays + arrays[-1:] * pad)
        )
        rows = stack.shape[0] // accum
        out[name] = (
            stack if accum == 1 else stack.reshape((rows, accum, *stack.shape[1:]))
        )
    return out


def refuse_changed(pending: list[Any], signature: Any, epoch: int) -> None:
    """Raise the refusal naming the first batch of a block whose field left the
    compiled signature; nothing when none did."""
    for _, batch, index in pending:
        refusal = changed_field(signature, batch, "train", index, epoch)
        if refusal is not None:
            raise ConfigError(refusal) from None


def host_bytes(batch: Mapping[str, Any]) -> int:
    """The bytes of a batch's arrays."""
    return sum(int(getattr(v, "nbytes", 0)) for v in batch.values())
