"""The scanned train program: several optimizer steps per dispatch (`steps_per_call`).

One program runs `length` optimizer steps with `jax.lax.scan` over the step body the
unscanned programs trace (`programs.gradient_fn` and `OptimizerPlan.apply`), so a
dispatch-bound run pays one launch, one argument placement and one Python call per
`length` steps instead of per step.

    train_calls(values_shared, values_stacked, Weights, model_state, accumulator,
                batches, hp_shared, hp_stacked, rng)
        -> (Weights, model_state, accumulator, StepOutputs stacked)
        donates: Weights and the accumulator

What varies per step is stacked along a leading axis of `length`: the batches
(`(length, B, ...)`, or `(length, accum, B, ...)` under accumulation), the host-made
step inputs (`hp_stacked`, `values_stacked`: every schedule value, computed on the
host for each of the steps, so schedules stay exact) and the rng inputs (uint32
`(length, 3)` or `(length, accum, 3)`, `experiment/rng.py`). What every step shares
(the decay anchors and masks, the unscheduled Device fields: device arrays) is passed
once. Each step's `StepOutputs` come back stacked, `(length, ...)` or
`(length, accum, ...)`, so the host settles and logs every step as an unscanned run
does.

The step body is the unscanned one, operation for operation: the gradient of each
micro-batch added into the accumulator as `a + g / accum`, the optimizer step on
the accumulated gradient, the accumulator zeroed. On CPU the parameters come out
bitwise equal to the same steps run one program per step
(`tests/loop/test_steps_per_call.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from ..optim.plan import OptimizerPlan
from .programs import GradientFields, TraceContext, gradient_fn


def split_inputs(tree: Any) -> tuple[Any, tuple[bool, ...]]:
    """`(treedef, stacked)`: which leaves of a step-input tree vary per step.

    A host value (a NumPy scalar or array, a Python number: what the plan and the
    schedules compute each step) is stacked along the call's steps; a device array
    (a mask, an anchor, an unscheduled Device field: made once) is shared.
    """
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return treedef, tuple(not isinstance(leaf, jax.Array) for leaf in leaves)


def merge_inputs(
    treedef: Any, stacked: tuple[bool, ...], shared: Any, step: Any
) -> Any:
    """The step-input tree of one step (traced), from the shared leaves and the
    step's slice of the stacked ones, in `split_inputs` order."""
    shared_it, step_it = iter(shared), iter(step)
    leaves = [next(step_it) if s else next(shared_it) for s in stacked]
    return jax.tree_util.tree_unflatten(treedef, leaves)


def scanned_fn(
    ctx: TraceContext,
    fields: GradientFields,
    accum: int,
    plan: OptimizerPlan,
    layout: tuple[Any, tuple[bool, ...], Any, tuple[bool, ...]],
) -> Callable:
    """The scanned program for `accum` micro-batches per step.

    `layout`: `(values_treedef, values_stacked, hp_treedef, hp_stacked)` from
    `split_inputs`, fixed for the program (it is part of its key).
    """
    compute = gradient_fn(ctx, fields, 1, plan)
    scale = 1.0 / accum
    values_def, values_stacked, hp_def, hp_stacked = layout

    def one_step(device_values, weights, state, accumulator, batch, hp, rng):
        if accum == 1:
            grads, state, reported = compute(
                device_values, weights.params, state, batch, hp["grad"], rng
            )
            view = ctx.make_view(device_values)
            return plan.apply(view, weights, grads, hp), state, accumulator, reported

        def micro(carry, xs):
            accumulator, state = carry
            micro_batch, micro_rng = xs
            grads, state, reported = compute(
                device_values, weights.params, state, micro_batch, hp["grad"], micro_rng
            )
            accumulator = jax.tree.map(lambda a, g: a + g * scale, accumulator, grads)
            return (accumulator, state), reported

        (accumulator, state), reported = jax.lax.scan(
            micro, (accumulator, state), (batch, rng)
        )
        view = ctx.make_view(device_values)
        weights = plan.apply(view, weights, accumulator, hp)
        return weights, state, jax.tree.map(jnp.zeros_like, accumulator), reported

    def program(
        values_shared,
        values_steps,
        weights,
        state,
        accumulator,
        batches,
        hp_shared,
        hp_steps,
        rng,
    ):
        def body(carry, xs):
            weights, state, accumulator = carry
            batch, values_step, hp_step, step_rng = xs
            device_values = merge_inputs(
                values_def, values_stacked, values_shared, values_step
            )
            hp = merge_inputs(hp_def, hp_stacked, hp_shared, hp_step)
            weights, state, accumulator, reported = one_step(
                device_values, weights, state, accumulator, batch, hp, step_rng
            )
            return (weights, state, accumulator), reported

        (weights, state, accumulator), reported = jax.lax.scan(
            body,
            (weights, state, accumulator),
            (batches, values_steps, hp_steps, rng),
        )
        return weights, state, accumulator, reported

    return program
