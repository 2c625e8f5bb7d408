"""Manual mode's optimizer pieces: `OptState`, `backward`, `step_optimizer`.

In manual mode the experiment writes the whole optimizer step (`train_step`); these
are what it calls inside it. Each network's optimizer state is an `OptState`: the
Optax state (`inner`, the pytree children) with its transformation (`tx`) carried as
static pytree metadata. So a state crosses a compiled program's boundary as it is,
`step_optimizer` needs no rule argument, and a checkpoint holds the bare arrays.
`strip_rules` and `merge_rules` remain for inspecting or saving the bare states
outside the framework. A schedule's opt key binds into the states
(`bind_hyperparams`): rules built with `optax.inject_hyperparams` expose their
hyperparameters as state arrays, so a scheduled value is an input of the step. A
bare key (`opt.learning_rate`) sets the field on every rule that has it, a path
(`opt.gen.learning_rate`) on the rules under one top-level key of the states.

    opt = {"gen": setup_optimizer(optax.adam(1e-3), params["gen"]), ...}
    loss, grads = backward(gen_loss, params["gen"], params["disc"], batch)
    opt_g, params_g = step_optimizer(opt["gen"], params["gen"], grads)
"""

from __future__ import annotations

import functools
import hashlib
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ..compile.boundary import owned_copy
from ..errors import HookError
from ..keys.program_key import Identity
from .rule_key import rule_key


@dataclass(frozen=True)
class OptState:
    """One network's optimizer state with its Optax transformation.

    Attributes:
        tx: the Optax `GradientTransformation`; static metadata (part of the tree
            structure, so another rule is another compiled program). Rules compare
            by what they compute (`optim.rule_key`): `optax.adam(1e-3)` built anew
            by each handle's `setup_optimizers` is the same rule, and compiles
            nothing twice.
        inner: the Optax state `tx.init(params)` returned; the pytree's children.
    """

    tx: optax.GradientTransformation
    inner: Any


class _Rule:
    """An `OptState`'s pytree metadata: its transformation, equal to another by
    structure (`rule_key`), so a tree structure holding it keys compiled programs
    by what the rule computes rather than by the identity of its closures."""

    __slots__ = ("_hash", "_repr", "key", "tx")

    def __init__(self, tx: Any) -> None:
        self.tx = tx
        self.key = rule_key(tx)
        self._hash = hash(self.key)
        # By the key too: a packed state's program is keyed by its tree's repr
        # (`compile/packed.py`), where the transformation's own repr (closures at
        # their addresses) would make every handle's rules new.
        # A key holding an `Identity` (an object it cannot key by value) gets a
        # name never reused in this process: its repr would show an address,
        # which a later object could take.
        if _holds_identity(self.key):
            self._repr = f"_Rule(#{next(_UNIQUE)})"
        else:
            digest = hashlib.sha256(repr(self.key).encode()).hexdigest()[:16]
            self._repr = f"_Rule({digest})"

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Rule) and (
            other.tx is self.tx or other.key == self.key
        )

    def __repr__(self) -> str:
        return self._repr


_UNIQUE = itertools.count()


def _holds_identity(key: Any) -> bool:
    """Whether a `rule_key` holds an `Identity` anywhere."""
    if isinstance(key, Identity):
        return True
    if isinstance(key, tuple | list | frozenset | set):
        return any(_holds_identity(part) for part in key)
    if isinstance(key, dict):
        return any(_holds_identity(part) for part in key.items())
    return False


@functools.lru_cache(maxsize=512)
def _cached_rule(tx: Any) -> _Rule:
    return _Rule(tx)


def _rule(tx: Any) -> _Rule:
    try:
        return _cached_rule(tx)
    except TypeError:  # an unhashable transformation
        return _Rule(tx)


jax.tree_util.register_pytree_with_keys(
    OptState,
    lambda s: (((jax.tree_util.GetAttrKey("inner"), s.inner),), _rule(s.tx)),
    lambda rule, children: OptState(rule.tx, *children),
    flatten_func=lambda s: ((s.inner,), _rule(s.tx)),
)


def setup_optimizer(tx: optax.GradientTransformation, params: Any) -> OptState:
    """The optimizer state of `tx` for the parameter tree `params`.

    Examples:
        >>> import optax, jax.numpy as jnp
        >>> state = setup_optimizer(optax.sgd(0.1), {"w": jnp.zeros(2)})
        >>> type(state).__name__
        'OptState'
    """
    if not isinstance(tx, optax.GradientTransformation):
        raise HookError(
            f"setup_optimizer takes an Optax GradientTransformation (optax.adam(...)); "
            f"it was given {type(tx).__name__}."
        )
    return OptState(tx, tx.init(params))


def backward(f: Callable[..., Any], params_sub: Any, *consts: Any) -> tuple[Any, Any]:
    """One reverse pass of `f(params_sub, *consts)` with respect to `params_sub`.

    Everything in `consts` is constant (`jax.lax.stop_gradient`): no gradient flows
    into it. Every traced value `f` reads must be an argument: a traced value the
    objective captures from an enclosing scope (a closure) is a constant to the
    derivative, so a parameter subtree read that way gets a zero gradient with no
    error while the loss stays correct.

    Args:
        f: the objective, returning a float scalar.
        params_sub: the parameter subtree to differentiate.
        *consts: the objective's other inputs (another network's parameters, the
            batch, ...).

    Returns:
        (loss, grads): the scalar loss and a gradient tree matching `params_sub`.

    Examples:
        >>> import jax.numpy as jnp
        >>> loss, g = backward(lambda w, x: (w * x).sum(), jnp.ones(2), jnp.arange(2.0))
        >>> g.tolist()
        [0.0, 1.0]
    """
    frozen = jax.lax.stop_gradient(consts)
    loss, grads = jax.value_and_grad(f)(params_sub, *frozen)
    return loss, grads


def step_optimizer(opt_state: OptState, params: Any, grads: Any) -> tuple[Any, Any]:
    """One Optax update of `params` by `grads`: `(new_opt_state, new_params)`.

    Call it once per network inside `train_step`, with that network's `OptState`,
    parameter subtree and gradient (as `backward` returned it).
    """
    if not isinstance(opt_state, OptState):
        raise HookError(
            f"step_optimizer takes an OptState (what setup_optimizer(tx, params) "
            f"returns); it was given {type(opt_state).__name__}. Build each "
            f"network's state with jaxnitro.setup_optimizer in setup_optimizers."
        )
    updates, inner = opt_state.tx.update(grads, opt_state.inner, params)
    return OptState(opt_state.tx, inner), optax.apply_updates(params, updates)


def _is_opt_state(node: Any) -> bool:
    return isinstance(node, OptState)


def strip_rules(opt_state: Any) -> Any:
    """`opt_state` with every `OptState` replaced by its bare Optax state.

    Not needed to train: an `OptState` crosses programs and checkpoints as it is.
    Use it to inspect or save the states without their transformations.
    """
    return jax.tree.map(
        lambda s: s.inner if _is_opt_state(s) else s, opt_state, is_leaf=_is_opt_state
    )


def merge_rules(combined: Any, states: Any) -> Any:
    """The `OptState`s of `combined` with their states taken from `states` (a tree
    of bare states, as `strip_rules` returns): `strip_rules` reversed."""
    return jax.tree.map(
        lambda rule, state: OptState(rule.tx, state) if _is_opt_state(rule) else state,
        combined,
        states,
        is_leaf=_is_opt_state,
    )


HOST_NUMBER = (
    "setup_optimizers returned a host Python {kind} ({value!r}) at {path}. A "
    "Python number in an optimizer state is frozen into the compiled step as a "
    "constant (a step counter would never advance). Make it an array: "
    "jnp.asarray({value!r})."
)
NO_OPT_STATE = (
    "setup_optimizers returned {kind} with no OptState in it. Build each network's "
    "state with jaxnitro.setup_optimizer(tx, params_subtree), e.g. "
    '{{"gen": setup_optimizer(optax.adam(1e-4), params["gen"]), ...}}, so '
    "step_optimizer finds the transformation in the state."
)


def python_number(tree: Any) -> tuple[str, Any] | None:
    """The first host Python number in `tree` as `(key path, value)`, or None: a
    leaf a compiled step would freeze as a constant."""
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        if isinstance(leaf, bool | int | float | complex):
            return jax.tree_util.keystr(path), leaf
    return None


def place_opt_states(opt_state: Any) -> Any:
    """Check what `setup_optimizers` returned and place every leaf on the device.

    Refuses a host Python number in any leaf, naming its key path, and a tree with
    no `OptState` in it. NumPy leaves are placed (own device copies, since the
    manual step donates them).
    """
    if not any(
        _is_opt_state(n) for n in jax.tree.leaves(opt_state, is_leaf=_is_opt_state)
    ):
        raise HookError(NO_OPT_STATE.format(kind=type(opt_state).__name__))
    found = python_number(opt_state)
    if found is not None:
        path, leaf = found
        raise HookError(
            HOST_NUMBER.format(
                kind=type(leaf).__name__, value=leaf, path=f"opt_state{path}"
            )
        )
        if not isinstance(leaf, jax.Array | np.ndarray | np.generic):
            raise HookError(
                f"setup_optimizers returned a {type(leaf).__name__} at "
                f"opt_state{jax.tree_util.keystr(path)}; every leaf of an optimizer "
                f"state must be an array."
            )
    return owned_copy(opt_state)


# The subtree name of an optimizer state that is itself an OptState (no subtrees).
WHOLE_TREE = "default"


def _subtree(path: tuple[Any, ...]) -> str:
    """The top-level key of a key path into the optimizer-state tree, as a schedule
    path names it (`opt.<subtree>.<field>`): a dict key, an attribute, an index."""
    if not path:
        return WHOLE_TREE
    top = path[0]
    for attribute in ("key", "name", "idx"):
        if hasattr(top, attribute):
            return str(getattr(top, attribute))
    return str(top)


def hyperparameters_by_subtree(opt_state: Any) -> dict[str, tuple[str, ...]]:
    """What schedules may set in manual mode: for each top-level subtree of the
    optimizer states (`"gen"` of `{"gen": ..., "disc": ...}`) holding an
    `OptState`, the hyperparameters its rules expose (those built with
    `optax.inject_hyperparams`), sorted. A state that is one `OptState` is the
    subtree "default"."""
    found: dict[str, set[str]] = {}
    leaves, _ = jax.tree_util.tree_flatten_with_path(opt_state, is_leaf=_is_opt_state)
    for path, node in leaves:
        if _is_opt_state(node):
            names = getattr(node.inner, "hyperparams", None) or {}
            found.setdefault(_subtree(path), set()).update(names)
    return {subtree: tuple(sorted(names)) for subtree, names in found.items()}


def bind_hyperparams(
    opt_state: Any, values: Mapping[tuple[str, str], tuple[Any, Any]]
) -> Any:
    """`opt_state` with the scheduled hyperparameters set, absolutely; traced, so a
    new value compiles nothing, and the tree structure is unchanged.

    `values` maps `(subtree, name)` to `(value, scheduled)`, for every
    hyperparameter the states expose (`OptimizerPlan.manual_targets`): where
    `scheduled` (a traced bool) holds, each `OptState` under that top-level key whose
    rule has `name` (`optax.inject_hyperparams`) takes `value`, elsewhere it keeps
    its own. So which keys a run schedules is an input, not a program.
    """
    by_subtree: dict[str, dict[str, tuple[Any, Any]]] = {}
    for (subtree, name), pair in values.items():
        by_subtree.setdefault(subtree, {})[name] = pair

    def bind(path: tuple[Any, ...], node: Any) -> Any:
        hyper = (
            getattr(node.inner, "hyperparams", None) if _is_opt_state(node) else None
        )
        if not hyper:
            return node
        wanted = by_subtree.get(_subtree(path), {})
        if not any(name in hyper for name in wanted):
            return node
        new = {
            name: jnp.where(
                wanted[name][1], jnp.asarray(wanted[name][0], jnp.result_type(old)), old
            )
            if name in wanted
            else old
            for name, old in hyper.items()
        }
        return OptState(node.tx, node.inner._replace(hyperparams=new))

    return jax.tree_util.tree_map_with_path(bind, opt_state, is_leaf=_is_opt_state)
