"""A block: the batches of several optimizer steps, stacked into one value per field.

The calls loop (`calls.py`) reads a block of steps' batches from the feed, stacks
each routed field into `(K, B, ...)` (or `(K, accum, B, ...)` under accumulation)
and places the stack with one transfer, which the block's calls then read by
position. Here: how many steps a block holds, the stack itself, and the refusal of
a block whose batches changed a field's shape or dtype.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from ..data.signature import changed_field
from ..errors import ConfigError
from .host_buffers import HostBuffers

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
CPU_DIRECT_BATCH_BYTES = 64 * 2**10
"""`DIRECT_BATCH_BYTES` on a CPU backend. There a transfer is a host copy, but the
executable's conversion of each host argument costs a dispatch about as much as the
step of a small model: a block of 8 small batches, stacked and placed once, took a
tiny MLP's one step a call from 0.71-0.77x of the hand-written loop to 0.79-0.82x
at 2.7 KB a batch, from 0.65-0.78x to 0.88-1.00x at 21 KB, 0.78x to 0.88x at 42
KB, and about even at 84 and 168 KB; the tutorial MLP's 317 KB batches went from
0.91-0.97x down to 0.80-0.83x (interleaved in one process, 2 cores,
2026-12-07)."""
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
    buffers: HostBuffers | None = None,
) -> dict[str, Any]:
    """A block's routed batches as one: each field `(size, B, ...)`, or `(size,
    accum, B, ...)` under accumulation (one host copy per field; a field whose
    batches are all device arrays is stacked on the device); a block of fewer than
    `size` steps is padded with its last batch, which no call reaches. Without
    `pad_host` its host fields hold only its own `steps`: the block is about to be
    placed with `transfer(..., rows=size)`, which pads them on the device, so the
    transfer carries no padding (on a TPU host a compute-bound MLP's 4-step tail
    padded to 8 sent 3.2 MB more, about 1.3 ms of a 6 ms epoch). `buffers`: where
    the host stacks are allocated (reused once free: `host_buffers.py`).

    Raises ValueError when a field's batches differ in shape or dtype."""
    if size == steps == accum == 1:  # one batch (a large one at one step a call)
        (batch,) = routed
        if all(type(value) is np.ndarray for value in batch.values()):
            return {name: value[None] for name, value in batch.items()}  # views
    pad = (size - steps) * accum if pad_host else 0
    out: dict[str, Any] = {}
    on_device: dict[str, list[Any]] = {}
    for name in routed[0]:
        arrays = [batch[name] for batch in routed]
        if all(type(a) is np.ndarray for a in arrays):  # the usual host field
            out[name] = _by_step(_filled(name, arrays, pad, buffers), accum)
        elif all(isinstance(a, jax.Array) for a in arrays):  # stays on the device
            if len({a.dtype for a in arrays}) > 1:  # a stack would promote them
                raise ValueError(f"field {name} holds several dtypes")
            on_device[name] = arrays
        else:
            arrays = [np.asarray(a) for a in arrays]
            out[name] = _by_step(_filled(name, arrays, pad, buffers), accum)
    if on_device:
        out.update(_device_stacker((size - steps) * accum, accum)(on_device))
    return {name: out[name] for name in routed[0]}


def _filled(
    name: str, arrays: list[np.ndarray], pad: int, buffers: HostBuffers | None
) -> np.ndarray:
    """`arrays` stacked, then `pad` copies of the last: one allocation filled row by
    row (`np.stack` cost a tiny MLP's block of 8 batches 7 us a field against 3 us,
    its per-array views and checks). Raises ValueError, as `np.stack` would, where
    they differ in shape, and where they differ in dtype (a stack would promote)."""
    first = arrays[0]
    shape, dtype = first.shape, first.dtype
    for array in arrays:
        if array.shape != shape:  # a row would broadcast it, not refuse it
            raise ValueError(f"field {name} holds several shapes")
        if array.dtype != dtype:
            raise ValueError(f"field {name} holds several dtypes")
    rows = (len(arrays) + pad, *shape)
    stacked = np.empty(rows, dtype) if buffers is None else buffers.empty(rows, dtype)
    for row, array in enumerate(arrays):
        stacked[row] = array
    if pad:
        stacked[len(arrays) :] = arrays[-1]
    return stacked


def _by_step(stack: Any, accum: int) -> Any:
    """A stack of micro-batches `(steps * accum, B, ...)` as `(steps, accum, B, ...)`
    under accumulation."""
    if accum == 1:
        return stack
    return stack.reshape((stack.shape[0] // accum, accum, *stack.shape[1:]))


@functools.lru_cache(maxsize=32)
def _device_stacker(pad: int, accum: int) -> Any:
    """The stack of a block's device fields as one program (`pad` copies of each
    field's last batch after it): stacked op by op, 8 batches of two fields took
    155 us on a 2-core CPU host, against 12 us for this one call."""

    def stack(fields: dict[str, list[Any]]) -> dict[str, Any]:
        return {
            name: _by_step(jax.numpy.stack(arrays + arrays[-1:] * pad), accum)
            for name, arrays in fields.items()
        }

    return jax.jit(stack)


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
