"""Parameter groups and the per-leaf masks: which leaf belongs where, and how.

`param_group(self, keypath) -> str` names each parameter leaf's group. "default" is
group 1; the others are numbered in order of first appearance (tree-flatten order), and
that layout bakes into the optimizer program. Each group gets its own Optax chain,
learning-rate ratio, decay coefficient and anchor. The per-leaf masks (decay exclusion,
SAM exclusion, ASAM scaling) are resolved once on the host and cross into the programs
as device buffers, so changing one compiles nothing.

A keypath is a tuple of plain keys: dict keys and attribute names as strings, sequence
indices as ints, e.g. `("params", "Dense_0", "kernel")`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from ..errors import HookError

DEFAULT_GROUP = "default"


def plain_keypath(path: tuple[Any, ...]) -> tuple[Hashable, ...]:
    """A JAX key path as plain keys: dict keys, attribute names, sequence indices."""
    keys: list[Hashable] = []
    for entry in path:
        if isinstance(entry, jax.tree_util.DictKey):
            keys.append(entry.key)
        elif isinstance(entry, jax.tree_util.GetAttrKey):
            keys.append(entry.name)
        elif isinstance(entry, jax.tree_util.SequenceKey):
            keys.append(entry.idx)
        elif isinstance(entry, jax.tree_util.FlattenedIndexKey):
            keys.append(entry.key)
        else:
            keys.append(str(entry))
    # Flax NNX wraps each leaf in a Variable whose `.value` is a key of its own.
    if keys and keys[-1] == "value" and len(keys) > 1:
        keys.pop()
    return tuple(keys)


def default_no_decay(keypath: tuple[Hashable, ...], leaf: Any) -> bool:
    """The built-in decay exclusion: every leaf of rank 1 or less (biases, norms).

    Examples:
        >>> default_no_decay(("dense", "bias"), np.zeros(3))
        True
        >>> default_no_decay(("dense", "kernel"), np.zeros((3, 3)))
        False
    """
    del keypath
    return int(np.ndim(leaf)) <= 1


def default_adaptive_perturb(keypath: tuple[Hashable, ...], leaf: Any) -> bool:
    """ASAM scales rank-2 and higher leaves by their size; others stay unscaled."""
    del keypath
    return int(np.ndim(leaf)) >= 2


@dataclass(frozen=True)
class GroupLayout:
    """Which group each parameter leaf belongs to; baked into the optimizer program.

    Attributes:
        names: the groups in order: "default" first, then by first appearance.
        labels: the group name of each leaf, in tree-flatten order.
    """

    names: tuple[str, ...]
    labels: tuple[str, ...]

    def label_tree(self, params: Any) -> Any:
        """The labels as a tree shaped like `params` (for `optax.multi_transform`)."""
        treedef = jax.tree_util.tree_structure(params)
        return jax.tree_util.tree_unflatten(treedef, list(self.labels))

    def key(self) -> tuple[Any, ...]:
        """A hashable summary for the optimizer program's cache key."""
        return (self.names, self.labels)


def group_layout(
    params: Any, param_group: Callable[[tuple[Hashable, ...]], Any] | None
) -> GroupLayout:
    """Assign every parameter leaf a group by calling `param_group(keypath)`."""
    paths = [
        plain_keypath(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]
    ]
    labels = []
    for keypath in paths:
        group = DEFAULT_GROUP if param_group is None else param_group(keypath)
        if not isinstance(group, str) or not group:
            raise HookError(
                f"param_group{keypath!r} returned {group!r}; it must return a group "
                f'name (a non-empty str), "default" for the default group.'
            )
        labels.append(group)
    names = [DEFAULT_GROUP]
    names += [g for g in dict.fromkeys(labels) if g != DEFAULT_GROUP]
    return GroupLayout(tuple(names), tuple(labels))


def leaf_mask(
    params: Any,
    rule: Callable[[tuple[Hashable, ...], Any], Any],
    hook: str,
) -> Any:
    """A tree of NumPy float32 scalars, 1 where `rule(keypath, leaf)` is true.

    Host scalars, not device ones: as a step input each travels as a column of the
    step's packed float32 vector (`compile/scanned.py`), where a device scalar
    was a program argument of its own, one per parameter leaf at every call (the
    tutorial MLP's step took 23 arguments for the hand-written loop's 15)."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    values = []
    for path, leaf in flat:
        verdict = rule(plain_keypath(path), leaf)
        if not isinstance(verdict, bool | np.bool_):
            raise HookError(
                f"{hook}{plain_keypath(path)!r} returned {verdict!r}; it must return "
                f"True or False."
            )
        values.append(np.float32(1.0 if verdict else 0.0))
    return jax.tree_util.tree_unflatten(treedef, values)
