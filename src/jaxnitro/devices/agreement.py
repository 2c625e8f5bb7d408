"""Across processes: one stop decision that every rank of a training run shares.

A stop request (`request_stop()` from a monitor or callback, Ctrl+C, a SIGTERM)
reaches one process at a time, at different moments on different ranks. A rank
that left its step loop on its own flag would leave the others waiting in the next
step's all-reduce, so across processes the loop stops on an agreed flag instead:
at agreement points every rank sends its own flags (one small all-gather) and all
stop at that step when any asked. The points fall at the same steps on every rank:
after the first step, then every `interval` steps, where every rank derives the
interval from the same gathered step times (about `AGREE_SECONDS` apart, at most
`AGREE_MOST_STEPS` steps), and at each epoch's end. A stop is then honoured within
about half a second or one step, whichever is longer, and a fast step pays one
tiny collective per `AGREE_MOST_STEPS` steps.

When any rank's request came from a SIGTERM, every rank's stop is a preemption
(stop_reason "preempted"): the job is being taken away, whichever rank heard it.

In one process nothing is gathered: the vote is the process's own flags.

    >>> agree_stop(True, preempted=False)
    StopVote(stop=True, preempted=False, seconds_per_step=0.0)
"""

from __future__ import annotations

import time
from typing import NamedTuple

import jax
import numpy as np

AGREE_SECONDS = 0.5
"""The wall time between agreement points the interval aims at."""
AGREE_MOST_STEPS = 16
"""The most steps between agreement points (a fast step's interval)."""


class StopVote(NamedTuple):
    """What the ranks decided at an agreement point, the same on every rank."""

    stop: bool
    """Whether any rank asked to stop."""
    preempted: bool
    """Whether any rank's request was a SIGTERM's (then every rank's stop is)."""
    seconds_per_step: float
    """The slowest rank's seconds per step since the last point (0: not known)."""


def agree_stop(
    requested: bool, *, preempted: bool = False, seconds_per_step: float = 0.0
) -> StopVote:
    """Every rank's stop flags, joined: stop when any rank `requested` one, a
    preemption when any rank's was. A collective across processes: every process
    calls it at the same step. In one process it returns its own flags."""
    if jax.process_count() == 1:
        return StopVote(bool(requested), bool(preempted), float(seconds_per_step))
    from jax.experimental import multihost_utils

    micros = round(seconds_per_step * 1e6)
    mine = np.array([int(requested), int(preempted), micros], np.int64)
    every = np.asarray(multihost_utils.process_allgather(mine, tiled=False))
    return StopVote(
        bool(every[:, 0].any()), bool(every[:, 1].any()), float(every[:, 2].max()) / 1e6
    )


def agree_interval(seconds_per_step: float) -> int:
    """The steps to the next agreement point at `seconds_per_step` (every rank's
    slowest): about `AGREE_SECONDS`, 1 to `AGREE_MOST_STEPS`.

    >>> agree_interval(0.001), agree_interval(0.1), agree_interval(3.0)
    (16, 5, 1)
    """
    if seconds_per_step <= 0:
        return AGREE_MOST_STEPS
    return max(1, min(AGREE_MOST_STEPS, int(AGREE_SECONDS / seconds_per_step)))


class StopAgreement:
    """The agreed stop of one `train()` across processes: what its loop reads
    instead of the process's own flags (`stop_requested`, `preempted`, the names
    the run's `StopControl` gives them), changed only by `vote`, which every rank
    calls at the same steps (`next_at`, and each epoch's end)."""

    def __init__(self, step: int) -> None:
        self.stop_requested = False
        """Whether the ranks agreed to stop (it stays so for the train())."""
        self.preempted = False
        """Whether the agreed stop is a preemption."""
        self.next_at = step + 1
        """The step of the next agreement point in the step loop."""
        self._since = (step, time.perf_counter())
        self._interval = 1  # until a step time is known

    def vote(self, step: int, requested: bool, preempted: bool) -> int:
        """Agree at `step` on this rank's `requested` and `preempted` flags (a
        collective); returns the next agreement point's step."""
        last, started = self._since
        now = time.perf_counter()
        per_step = (now - started) / (step - last) if step > last else 0.0
        vote = agree_stop(requested, preempted=preempted, seconds_per_step=per_step)
        if vote.stop and not self.stop_requested:
            self.stop_requested, self.preempted = True, vote.preempted
        self._since = (step, now)
        if vote.seconds_per_step > 0:  # 0 on every rank alike: no step since
            self._interval = agree_interval(vote.seconds_per_step)
        self.next_at = step + self._interval
        return self.next_at
