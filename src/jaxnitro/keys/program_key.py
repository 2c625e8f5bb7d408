"""What a compiled program is keyed by: `ProgramKey` and its parts.

A key holds everything a compiled program depends on: the program kind, the experiment
class (by module and qualname, so a reloaded class with unchanged hooks still hits),
the GraphConst values, the fingerprints of the code the program traces
(`keys.fingerprint`), the model's static part, the abstract signature of every
argument (tree structure, shapes, dtypes, shardings), the constants baked into the
program, and the compile options. Device values, seeds, max_epochs and run_dir are in
no key. A hit that served the wrong program would be the worst bug this framework
could have, so every static a program captures belongs in its key. The cache that
maps keys to executables is `compile.cache`.
"""

from __future__ import annotations

from collections.abc import Hashable
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
