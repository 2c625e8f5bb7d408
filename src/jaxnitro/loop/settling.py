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
from typing import Any, NamedTuple

import jax
import numpy as np

from ..compile.boundary import StepOutputs
from ..compile.scanned import ring_losses
from .epoch_log import EpochLog, InFlight, Stacked, sliced


class UnreadCall(NamedTuple):
    """A dispatched call whose losses have not been read back yet."""

    reported: StepOutputs  # every leaf stacked (K, ...) or (K, accum, ...)
    first: int  # the optimizer steps done before it
    batches: list[tuple[Mapping[str, Any], Any, int]]
    """Each micro-batch, as its block holds it: (host, routed fields, index)."""
    lines: list[dict[str, float] | None] | None
    """Each step's schedule line where it is logged; None: no step is logged."""
    ring: Any  # the counter and loss ring as this call left it


def settle_calls(log: EpochLog, calls: list[UnreadCall], accum: int) -> None:
    """Settle each micro-batch of `calls`, in order, as one call a step would,
    from one read-back of the last call's loss ring."""
    if not calls:
        return
    ring = ring_losses(calls[-1].ring)
    every = log.every if log.logging else 0  # 0: no train line anywhere
    # Runs of consecutive calls carrying only their losses, no train line among
    # their steps, are settled together (at one step a call, an epoch's reads
    # settle tens of calls: the test is written out here, a call costs it
    # about a microsecond).
    run: list[UnreadCall] = []
    run_end = 0  # the optimizer steps done once the run's last call is
    for call in calls:
        reported, first = call.reported, call.first
        end = first + len(call.batches) // accum
        plain = not (reported.terms or reported.stats or reported.outputs is not None)
        joins = plain and (not every or end // every == first // every)
        if run and not (joins and first == run_end):
            _settle_run(log, run, ring, accum)
            run = []
        if joins:
            run.append(call)
            run_end = end
        elif plain:  # a train line among its steps: settled around it
            _settle_logged(log, call, ring, accum)
        else:
            _settle_each(log, call, ring, accum)
    _settle_run(log, run, ring, accum)
    log.show_latest()


def _settle_run(
    log: EpochLog, run: list[UnreadCall], ring: np.ndarray, accum: int
) -> None:
    """Consecutive calls carrying only their losses, settled together (at one step
    a call, the calls between two reads): one slice of the ring, one
    `settle_losses`; one by one where the divergence check refuses a loss."""
    if not run:
        return
    count = sum(len(call.batches) for call in run)
    if log.settle_losses(ring_slice(ring, run[0].first * accum, count)):
        return
    for call in run:
        _settle_each(log, call, ring, accum)


def ring_slice(ring: np.ndarray, start: int, count: int) -> list[float]:
    """The `count` losses of the ring from micro-batch `start` on, wrapping round.

    >>> ring_slice(np.arange(4.0), 3, 3)
    [3.0, 0.0, 1.0]
    """
    size = ring.shape[0]
    start %= size
    end = start + count
    if end <= size:
        return ring[start:end].tolist()
    if count <= size:
        return ring[start:].tolist() + ring[: end - size].tolist()
    return ring[(start + np.arange(count)) % size].tolist()


def _settle_logged(
    log: EpochLog, call: UnreadCall, ring: np.ndarray, accum: int
) -> None:
    """A call that carries only its losses and holds a logged step: its other
    steps settled together (`EpochLog.settle_losses`, one by one where the
    divergence check refuses one), each logged step micro-batch by micro-batch,
    which writes its train line."""
    steps = len(call.batches) // accum
    done = 0  # the call's steps settled
    for step in range(steps):
        if (call.first + step + 1) % log.every == 0:
            _settle_steps(log, call, ring, accum, done, step)
            _settle_each(log, call, ring, accum, step, step + 1)
            done = step + 1
    _settle_steps(log, call, ring, accum, done, steps)


def _settle_steps(
    log: EpochLog, call: UnreadCall, ring: np.ndarray, accum: int, start: int, stop: int
) -> None:
    """The call's steps `start` to `stop` (none logged) settled together."""
    count = (stop - start) * accum
    at = (call.first + start) * accum
    if count and not log.settle_losses(ring_slice(ring, at, count)):
        _settle_each(log, call, ring, accum, start, stop)


def _settle_each(
    log: EpochLog,
    call: UnreadCall,
    ring: np.ndarray,
    accum: int,
    start: int = 0,
    stop: int | None = None,
) -> None:
    """One call's micro-batches settled one by one (`EpochLog.settle`): those of
    its steps `start` to `stop` (all by default)."""
    reported = call.reported
    terms, stats = reported.terms, reported.stats
    size = ring.shape[0]
    outputs = None if reported.outputs is None else jax.device_get(reported.outputs)
    first = start * accum
    last = len(call.batches) if stop is None else stop * accum
    for j, (host, _, index) in enumerate(call.batches[first:last], first):
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
                call.lines[step] if ends and call.lines is not None else None,
            )
        )
    if stats and log.logging:  # for the epoch's means: once a call, unread
        log.means.add_call(stats, len(call.batches) // accum, accum)
