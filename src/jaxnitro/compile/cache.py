"""The module-level compile cache: key -> compiled executable.

A key holds everything a compiled program depends on: the program kind, the experiment
class (by module and qualname, so a reloaded class with unchanged hooks still hits),
the GraphConst values, the fingerprints of the code the program traces, the model's
static part, the abstract signature of every argument (tree structure, shapes, dtypes,
shardings), the constants baked into the program, and the compile options. Device
values, seeds, max_epochs and run_dir are in no key. A hit that served the wrong program
would be the worst bug this framework could have, so every static a program captures
belongs in its key.

JAX's persistent compilation cache is configured too (by setup, before any hook runs),
so a second process skips XLA compilation of every program and eager op that took 10
ms or more to compile: `JAXNITRO_COMPILATION_CACHE` moves it (a directory) or switches
it off ("0", "off", "false").
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

import jax
import numpy as np


class Identity:
    """A key part for an object that has no value to key by: equal only to itself,
    which it holds alive while the key lives (so its id is never reused)."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Identity) and other.obj is self.obj


@dataclass(frozen=True)
class ProgramKey:
    """Everything one compiled program depends on.

    The host constants (`graphconst`, `baked`, `compile_options`) are stored as
    `typed_key` of each value, so that values which compare equal but trace apart
    key apart.
    """

    kind: str
    experiment: tuple[str, str]
    graphconst: tuple[tuple[str, Any], ...]
    code: str
    model: Hashable
    signature: Hashable
    baked: tuple[tuple[str, Any], ...]
    compile_options: tuple[tuple[str, Any], ...]

    def __post_init__(self) -> None:
        for name in ("graphconst", "baked", "compile_options"):
            pairs = getattr(self, name)
            typed = tuple((key, typed_key(value)) for key, value in pairs)
            object.__setattr__(self, name, typed)


def typed_key(value: Any) -> Hashable:
    """`value` as a key that tells apart values Python calls equal.

    `1 == 1.0 == True` and `0.0 == -0.0` hash alike, yet a traced program bakes an
    int32, a float32 or a bool constant, and a zero of either sign, so each part of
    the value keys together with its type, recursively through containers, and a
    float keys by its repr (which also lets a NaN equal itself).

    Examples:
        >>> typed_key((1, 2)) == typed_key((True, 2.0)), (1, 2) == (True, 2.0)
        (False, True)
    """
    kind = type(value)
    if isinstance(value, float | complex | np.floating | np.complexfloating):
        return (kind, repr(value))
    if isinstance(value, tuple | list):
        return (kind, tuple(typed_key(item) for item in value))
    if isinstance(value, frozenset | set):
        return (kind, frozenset(typed_key(item) for item in value))
    if isinstance(value, dict):
        items = frozenset((typed_key(k), typed_key(v)) for k, v in value.items())
        return (kind, items)
    if is_dataclass(value) and not isinstance(value, type):
        params = getattr(value, "__dataclass_params__", None)
        if params is not None and params.eq:  # it compares by these fields
            return (
                kind,
                tuple(
                    (f.name, typed_key(getattr(value, f.name)))
                    for f in fields(value)
                    if f.compare
                ),
            )
    return (kind, value)


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


def abstract_signature(tree: Any) -> Hashable:
    """The tree structure plus each leaf's shape, dtype, weak type and sharding."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return (treedef, tuple(_leaf_signature(leaf) for leaf in leaves))


def _leaf_signature(leaf: Any) -> Hashable:
    # A host array and an array on the default device are the same argument to a
    # compiled program (it places a host array itself), so both key as "default":
    # scheduling a Device field, which feeds it as a NumPy scalar, compiles nothing.
    if isinstance(leaf, jax.Array):
        sharding: Any = leaf.sharding
        if isinstance(sharding, jax.sharding.SingleDeviceSharding) and (
            sharding.device_set == {jax.devices()[0]}
        ):
            sharding = "default"
        return (leaf.shape, leaf.dtype, getattr(leaf, "weak_type", False), sharding)
    if isinstance(leaf, np.ndarray | np.generic):
        return (np.shape(leaf), np.asarray(leaf).dtype, False, "default")
    return ("python", type(leaf))


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
    """Point JAX's persistent compilation cache at the jaxnitro cache directory.

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
        directory = setting or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
            "jaxnitro",
            "xla",
        )
        jax.config.update("jax_compilation_cache_dir", directory)
        jax.config.update(
            "jax_persistent_cache_min_compile_time_secs", PERSISTENT_MIN_COMPILE_SECS
        )
        return directory
