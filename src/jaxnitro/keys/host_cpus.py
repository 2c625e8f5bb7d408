"""The CPUs this process may use: what XLA's CPU compiler splits a program's loops
over (so the persistent compile cache keeps its programs apart by it), and what
the prefetch pool sizes its workers from."""

from __future__ import annotations

import os


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity).

    >>> usable_cpus() >= 1
    True
    """
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
