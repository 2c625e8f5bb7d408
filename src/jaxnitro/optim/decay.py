"""`Decay`: decoupled weight decay toward an anchor, last in each group's chain.

    update <- update - mask * weight_decay * (params - anchor)

`weight_decay` arrives pre-multiplied by the group's effective learning rate (the
framework places Decay after the base rule, as AdamW does), `mask` is 0 for a leaf
`no_decay` excludes and 1 otherwise, and `anchor` is None for ordinary decay toward
zero (no subtraction is emitted at all), the parameters `build_model` returned for
L2-SP ("w0"), or an explicit tree. The anchor is a value the program receives, not
state captured at init, which on a resume would capture the restored weights.
"""

from __future__ import annotations

import hashlib
from typing import Any

import jax
import numpy as np
import optax

from ..errors import ConfigError

ANCHOR_KINDS = ("zero", "w0")

# Decay's fields that no schedule may set (the spec's nonschedulable(Decay)), each with
# the hook that sets it: parameter-sized trees, which a group's hp carries under these
# names at every level.
DECAY_NONSCHEDULABLE = {
    "anchor": 'decay_anchor(group) ("zero", "w0" or a parameter tree)',
    "no_decay_mask": "no_decay(keypath, leaf)",
}


def Decay(  # noqa: N802 - named like the spec's rule, a constructor
    weight_decay: Any, anchor: Any = None, mask: Any = None
) -> optax.GradientTransformation:
    """Decoupled decay toward `anchor` (None: toward zero), gated per leaf by `mask`.

    Examples:
        >>> import jax.numpy as jnp
        >>> rule = Decay(0.1)
        >>> params = {"w": jnp.array([1.0, -2.0])}
        >>> updates, _ = rule.update({"w": jnp.zeros(2)}, rule.init(params), params)
        >>> updates["w"].tolist()
        [-0.10000000149011612, 0.20000000298023224]
    """

    def init_fn(params: Any) -> optax.EmptyState:
        del params
        return optax.EmptyState()

    def update_fn(updates: Any, state: Any, params: Any = None) -> Any:
        if params is None:
            raise ValueError("Decay needs the parameters: pass params to update().")

        def pull(update: Any, param: Any, gate: Any, target: Any) -> Any:
            distance = param if target is None else param - target
            step = weight_decay * distance
            if gate is not None:
                step = gate * step
            return update - step.astype(update.dtype)

        gates = mask if mask is not None else jax.tree.map(lambda _: None, updates)
        targets = (
            anchor if anchor is not None else jax.tree.map(lambda _: None, updates)
        )
        new = jax.tree.map(
            pull, updates, params, gates, targets, is_leaf=lambda x: x is None
        )
        return new, state

    return optax.GradientTransformation(init_fn, update_fn)


def check_anchor(group: str, anchor: Any) -> str:
    """Normalize a `decay_anchor` value to "zero", "w0" or "tree", refusing others."""
    if isinstance(anchor, str):
        if anchor not in ANCHOR_KINDS:
            raise ConfigError(
                f'decay_anchor({group!r}) returned {anchor!r}; it must be "zero", '
                f'"w0", or a parameter tree to anchor to.'
            )
        return anchor
    if anchor is None:
        return "zero"
    return "tree"


def anchor_mismatch(tree: Any, params: Any) -> str | None:
    """How an anchor tree fails to match the parameters leaf for leaf, or None.

    The first missing or extra leaf, or the first leaf whose shape differs, by key
    path: Decay would broadcast a wrongly shaped anchor without a word.
    """
    anchor = _by_keypath(tree)
    wanted = _by_keypath(params)
    for key, param in wanted.items():
        if key not in anchor:
            return f"it has no leaf at {key}"
        if np.shape(anchor[key]) != np.shape(param):
            return (
                f"its leaf {key} has shape {np.shape(anchor[key])} where the "
                f"parameter has shape {np.shape(param)}"
            )
    extra = [key for key in anchor if key not in wanted]
    if extra:
        return f"its leaf {extra[0]} is not a parameter"
    got, want = jax.tree.structure(tree), jax.tree.structure(params)
    if got != want:  # type: ignore[operator]
        return f"its containers differ from the parameters' ({got} against {want})"
    return None


def _by_keypath(tree: Any) -> dict[str, Any]:
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {jax.tree_util.keystr(path): leaf for path, leaf in flat}


def anchor_checksum(tree: Any) -> str:
    """A checksum of an anchor's values, stored in checkpoints and checked on resume."""
    digest = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        digest.update(jax.tree_util.keystr(path).encode())
        digest.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
    return digest.hexdigest()
