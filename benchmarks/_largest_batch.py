"""The largest batch that fits: doubling, then bisecting, a bounded number of probes.

`largest_batch(probe, start=..., cap=...)` calls `probe(batch)` (which compiles and
runs a few steps at that batch and returns what it measured) at `start`, doubles
the batch while the probe fits and the cap is not reached, then bisects between the
largest batch that fitted and the smallest that ran out of memory. A probe that
raises an out-of-memory error (`is_out_of_memory`: XLA's RESOURCE_EXHAUSTED,
whether the compile or a step hit it, wrapped or not) is a batch that does not fit;
any other error propagates. When `start` itself does not fit the search halves
down from it. At most `max_probes` probes run.

    >>> def probe(batch):
    ...     if batch > 40:
    ...         raise MemoryError("RESOURCE_EXHAUSTED: 41 does not fit")
    ...     return batch * 10
    >>> search = largest_batch(probe, start=16, cap=256)
    >>> search.batch, search.result, [p.batch for p in search.probes]
    (40, 400, [16, 32, 64, 48, 40, 44, 42, 41])
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

OUT_OF_MEMORY = ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory")
"""What XLA's out-of-memory errors say (a compile that cannot place its buffers, an
allocation that fails), in the message of the error or of one it wraps."""


def is_out_of_memory(error: BaseException) -> bool:
    """Whether `error`, or an error it was raised from or during, is XLA running
    out of device memory."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if any(text in str(current) for text in OUT_OF_MEMORY):
            return True
        current = current.__cause__ or current.__context__
    return False


@dataclass(frozen=True)
class Probe:
    """One probe: the batch, whether it fitted, and the first line of its error."""

    batch: int
    fits: bool
    error: str | None = None


@dataclass
class Search:
    """A search's outcome: the largest batch that fitted (None: not even the
    smallest tried) and its probe's result, every probe in order, and why it
    stopped."""

    batch: int | None = None
    result: Any = None
    probes: list[Probe] = field(default_factory=list)
    stopped: str = ""

    def describe(self) -> str:
        """The probes as `16 ok, 32 out of memory, ...` and why the search
        stopped."""
        tried = ", ".join(
            f"{p.batch} {'ok' if p.fits else 'out of memory'}" for p in self.probes
        )
        return f"{tried}; {self.stopped}"


def largest_batch(
    probe: Callable[[int], Any],
    *,
    start: int,
    cap: int,
    max_probes: int = 10,
) -> Search:
    """The largest batch in 1..`cap` for which `probe(batch)` does not run out of
    memory, found from `start` in at most `max_probes` probes (see the module doc).

    Raises:
        ValueError: `start`, `cap` or `max_probes` below 1.
    """
    if min(start, cap, max_probes) < 1:
        raise ValueError(
            f"largest_batch needs start, cap and max_probes >= 1, got start={start}, "
            f"cap={cap}, max_probes={max_probes}"
        )
    search = Search()
    fits: int | None = None  # the largest batch that fitted
    fails: int | None = None  # the smallest batch that ran out of memory
    batch = min(start, cap)
    while True:
        if len(search.probes) == max_probes:
            search.stopped = f"stopped after {max_probes} probes"
            break
        try:
            result = probe(batch)
        except Exception as error:
            if not is_out_of_memory(error):
                raise
            first = str(error).strip().splitlines()[0] if str(error).strip() else ""
            search.probes.append(Probe(batch, False, first[:200]))
            fails = batch
        else:
            search.probes.append(Probe(batch, True))
            fits, search.batch, search.result = batch, batch, result
        gc.collect()  # a failed probe's arrays go before the next one allocates
        if fails is None:
            if batch >= cap:
                search.stopped = f"reached the cap, {cap}"
                break
            batch = min(2 * batch, cap)
        elif fits is None:
            if fails == 1:
                search.stopped = "even batch 1 runs out of memory"
                break
            batch = fails // 2
        else:
            if fails - fits <= 1:
                search.stopped = f"{fails} runs out of memory"
                break
            batch = (fits + fails) // 2
    return search
