"""Reading a dispatched call's losses back into the epoch's log.

The calls loop (`calls.py`) dispatches calls without reading anything back: each
micro-batch's loss lands in the device ring (`compile/scanned.py`). When something
needs the losses (a train line, the progress bar, a step event, the epoch's end,
the divergence check's latency), the loop reads the ring of the last call it
dispatched once and settles every call before it here, micro-batch by micro-batch
in order, as one call a step would have.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from ..compile.boundary import StepOutputs
from ..compile.scanned import ring_losses
from .epoch_log import EpochLog, InFlight, Stacked, sliced


@dataclass
class UnreadCall:
    """A dispatched call whose losses have not been read back yet."""

    reported: StepOutputs  # every leaf stacked (K, ...) or (K, accum, ...)
    first: int  # the optimizer steps done before it
    batches: list[tuple[Mapping[str, Any], int]]  # each micro-batch: (host, index)
    lines: list[dict[str, float] | None]  # each step's schedule line, when logged
    ring: Any  # the counter and loss ring as this call left it


def settle_calls(log: EpochLog, calls: list[UnreadCall], accum: int) -> None:
    """Settle each micro-batch of `calls`, in order, as one call a step would,
    from one read-back of the last call's loss ring."""
    if not calls:
        return
    ring = ring_losses(calls[-1].ring)
    size = ring.shape[0]
    for call in calls:
        reported = call.reported
        terms, stats = reported.terms, reported.stats
        count = len(call.batches)
        if (
            not terms
            and not stats
            and reported.outputs is None
            and not (
                log.logging
                and (call.first + count // accum) // log.every > call.first // log.every
            )
        ):  # losses only, no train line: settled together
            at = (call.first * accum + np.arange(count)) % size
            if log.settle_losses(ring[at].tolist()):
                continue
        outputs = None if reported.outputs is None else jax.device_get(reported.outputs)
        for j, (host, index) in enumerate(call.batches):
            step, micro = divmod(j, accum)
            at = (step,) if accum == 1 else (step, micro)
            ends = micro == accum - 1
            log.settle(
                InFlight(
                    ring[((call.first + step) * accum + micro) % size],
                    Stacked(terms, at) if terms else terms,
                    Stacked(stats, at) if stats else stats,
                    None if outputs is None else sliced(outputs, at),
                    host,
                    call.first + step + 1,
                    index,
                    ends,
                    call.lines[step] if ends else None,
                )
            )
        if stats and log.logging:  # for the epoch's means: once a call, unread
            log.means.add_call(stats, len(call.batches) // accum, accum)
    log.show_latest()
