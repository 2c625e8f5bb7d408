"""The module-level compile cache: `ProgramKey` -> compiled executable.

What a key holds, and why every static a program captures belongs in it, is
`keys.program_key`; this module is the store the handles share, with its counters
(`cache_stats`, `cache_reset`).

JAX's persistent compilation cache is configured too (by setup, before any hook runs),
so a second process skips XLA compilation of every program and eager op that took 10
ms or more to compile: `JAXNITRO_COMPILATION_CACHE` moves it (a directory) or switches
it off ("0", "off", "false"). Its entries are kept apart by the CPUs the process may
use (`cpus-N` under the directory): XLA's CPU compiler splits each elementwise loop
over that many threads when it compiles, and JAX's key does not hold the count, so a
program compiled in a process pinned to one core ran its loops on one thread in
every later process (a compute-bound MLP's CPU step 6% slower, found in
benchmarks/steps_per_call.py after a `--cores 1` run).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import jax

from ..keys.host_cpus import usable_cpus
from ..keys.program_key import ProgramKey


class CompileCache:
    """A thread-safe map from `ProgramKey` to a compiled executable, with counters."""

    def __init__(self) -> None:
        self._entries: dict[ProgramKey, Any] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get_or_compile(self, key: ProgramKey, compile_fn: Callable[[], Any]) -> Any:
        """The executable under `key`, compiling it with `compile_fn` on a miss."""
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self.hits += 1
                return found
            self.misses += 1
        executable = compile_fn()
        with self._lock:
            self._entries.setdefault(key, executable)
            return self._entries[key]

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "hits": self.hits,
                "misses": self.misses,
                "entries": len(self._entries),
            }

    def reset(self) -> None:
        with self._lock:
            self._entries.clear()
            self.hits = 0
            self.misses = 0

    def program_keys(self) -> list[ProgramKey]:
        with self._lock:
            return list(self._entries)


_CACHE = CompileCache()


def program_cache() -> CompileCache:
    """The process-wide compile cache every `Nitro` shares."""
    return _CACHE


def cache_stats() -> dict[str, int]:
    """The compile cache counters: `{"hits": ..., "misses": ..., "entries": ...}`.

    Examples:
        >>> sorted(cache_stats())
        ['entries', 'hits', 'misses']
    """
    return _CACHE.stats()


def cache_reset() -> None:
    """Empty the compile cache and its counters.

    Not part of the run path: it exists so a test can assert a miss, and so a session
    that changed something no key can see has an alternative to restarting.
    """
    _CACHE.reset()


# The shortest XLA compile the persistent cache keeps. On a CPU even an eager op
# (a parameter initializer's random draw, a zeros_like) takes 10-400 ms to compile
# and a few ms to read back, and a second process runs dozens of them before its
# first step: cached, they took the warm first step from 0.55x of the cold one to
# about 0.2x (benchmarks/first_step.py). Copies and the like that compile in a few
# ms stay out: not worth a file each.
PERSISTENT_MIN_COMPILE_SECS = 0.01

_PERSISTENT_LOCK = threading.Lock()
_persistent_configured = False


def configure_persistent_cache() -> str | None:
    """Point JAX's persistent compilation cache at the jaxnitro cache directory:
    `JAXNITRO_COMPILATION_CACHE` or `~/.cache/jaxnitro/xla`, in its `cpus-N`
    folder for the CPUs this process may use (module docstring).

    Leaves a directory the user configured alone. Returns the directory in effect.
    """
    global _persistent_configured
    with _PERSISTENT_LOCK:
        current = jax.config.values.get("jax_compilation_cache_dir")
        if _persistent_configured or current:
            return current or None
        _persistent_configured = True
        setting = os.environ.get("JAXNITRO_COMPILATION_CACHE", "")
        if setting.lower() in ("0", "off", "false", "no"):
            return None
        base = setting or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
            "jaxnitro",
            "xla",
        )
        directory = os.path.join(base, f"cpus-{usable_cpus()}")
        jax.config.update("jax_compilation_cache_dir", directory)
        jax.config.update(
            "jax_persistent_cache_min_compile_time_secs", PERSISTENT_MIN_COMPILE_SECS
        )
        return directory
