"""The typed values that cross a training program's boundary.

A program takes and returns these, never a positional tuple of arrays, and what it
donates is a whole argument: `Weights` (donated by the train step and the optimizer
program) and the accumulator (donated by the gradient and the optimizer program).
The model state is never donated: the handle hands it out (`nitro.states`).

    train_step(values, Weights, model_state, batch, hp)
        -> (Weights, model_state, StepOutputs)              donates: Weights
    gradient(values, params, model_state, accumulator, batch, grad_hp)
        -> (accumulator, model_state, StepOutputs)          donates: accumulator
    optimizer(values, Weights, accumulator, hp)
        -> (Weights, accumulator)                           donates: both
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax


class Weights(NamedTuple):
    """What an optimizer step overwrites in place: the programs donate all of it.

    Attributes:
        params: the parameter tree `build_model` returned, trained in place.
        opt_state: the Optax state of every group's chain; None until `train()`
            allocates (or restores) it.
        ema: the exponential moving average of `params` (same tree, same dtypes);
            None when the run keeps no EMA.
    """

    params: Any
    opt_state: Any
    ema: Any


class StepOutputs(NamedTuple):
    """What one training micro-batch reports, read back by the host a step later.

    Attributes:
        loss: the loss, a float32[] scalar on the device.
        terms: the loss's named terms (`loss` returning `(scalar, terms)`), each a
            scalar; an empty dict without them.
        stats: device `train_metrics`, a dict of arrays; empty without them.
        outputs: the forward's outputs when `train_metrics` runs on the host (it
            needs them there), else None.
    """

    loss: Any
    terms: Any
    stats: Any
    outputs: Any


def owned_copy(tree: Any) -> Any:
    """`tree` copied into buffers no one else holds, for a program to donate.

    A step donates (overwrites) its `Weights`, so what it starts from must not be
    an array the user still holds (`build_model`'s parameters, a restored tree).
    `jax.device_put(..., may_alias=False)` copies each leaf buffer to buffer, as
    `jnp.array` does, but compiles nothing: `jnp.array` of a device array runs an
    XLA copy program, compiled once per shape (5-30 ms each on a CPU), before the
    first step. Host leaves become device arrays of the same dtype and weak type
    as `jnp.array` gives.

    Examples:
        >>> import numpy as np
        >>> owned_copy({"w": np.ones(2, np.float32)})["w"].dtype
        dtype('float32')
    """
    leaves = jax.tree.leaves(tree)
    if all(not isinstance(x, jax.Array) or x.is_fully_addressable for x in leaves):
        return jax.device_put(tree, may_alias=False)
    # Across processes a leaf spans other hosts' devices: copied where it lies
    # (device_put without a target would move it to this process's first device).
    return jax.tree.map(_owned_in_place, tree)


def _owned_in_place(leaf: Any) -> Any:
    if isinstance(leaf, jax.Array):
        return jax.device_put(leaf, leaf.sharding, may_alias=False)
    return jax.device_put(leaf, may_alias=False)
