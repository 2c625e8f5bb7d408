"""The train program of the automatic loop: one to K optimizer steps per dispatch.

One program runs a call of `count` optimizer steps (1 <= count <= K) over a block of K
steps' batches staged on the device, from block position `start`, with a loop whose
trip count is a traced input (`lax.fori_loop`). So a single program serves every call
length up to K: steps_per_call=1 is a call of length 1, and a call cut short by the
epoch's end or an event takes the same program. A dispatch-bound run pays one launch
and one Python call per call, and no host-to-device transfer beyond the block's
batches: the step number and the step rng are carried on the device, and each
micro-batch's loss is written into a device ring the host reads back only when a log
line, the progress bar or the divergence check needs it. Both travel in one buffer
(`ring`): on a TPU host each argument and each result of a call costs several
microseconds of dispatch, so a call takes and returns as few as it can.

    train_step(values_shared, values_steps, weights, model_state, accumulator, block,
               hp_shared, hp_steps, start, count, ring)             (TrainCallArgs)
        -> (Weights, model_state, accumulator, StepOutputs stacked, ring)
        donates: Weights and the accumulator

A small state (`compile/packed.py`) comes in and goes out packed: its flat buffers
in the Weights' place (donated), `()` for model_state and the accumulator. Off a
CPU the program unpacks it on entry and packs it on exit; on a CPU around each step,
so that a step's fusions are the same at every call length.

- `block`: every routed field stacked `(K, B, ...)`, or `(K, accum, B, ...)` under
  accumulation; steps past the epoch's end are padding a call never reaches.
- `values_steps`: every Device field stacked `(K, ...)`, scheduled or not (so a
  schedule changes no program); `hp_steps`: the host-made optimizer inputs (every
  schedule value, computed on the host for each of the block's steps, so schedules
  stay exact) stacked `(K, ...)`, the float32 scalars among them (learning rates,
  rule fields) as one `(K, n)` array (`PACKED`), so each costs neither a transfer
  nor an argument of its own; both placed once a block (once while no schedule
  varies); `values_shared` (empty), `hp_shared`: what every step shares (masks,
  anchors: device arrays), passed as they are.
- `start`, `count`: int32 scalars, the call's first block position and its length
  (device constants made once, `call_positions`).
- `ring`: uint32[3 + T]. Words 0-2 are the counter `(seed, global optimizer step of
  the call's first step, 0)`: step j of the call folds `(seed, step + j, micro)`
  into `step_rng()` (`experiment/rng.py`), whatever the steps per call, and the
  step comes back advanced by `count`. Words 3 on
  are the loss ring, float32 bits (`ring_losses`): the loss of micro-batch m
  (global index `step * accum + micro`) at `3 + m % T`. Not donated, so the host
  may still read an earlier one.

Each step's `StepOutputs` come back stacked `(K, ...)` (or `(K, accum, ...)`) by
position in the call, without the loss (the ring holds it); rows past `count` are
zeros.

The step body (`automatic_step`, or manual mode's own `train_step`) is the same
whatever the call's length: the gradient of each micro-batch added into the
accumulator as `a + g / accum`, the optimizer step on the accumulated gradient, the
accumulator zeroed. On CPU the parameters come out bitwise
equal whatever the steps per call (`tests/loop/test_steps_per_call.py`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .optimizer_step import OptimizerStep
from .packed import Packing
from .programs import GradientFields, TraceContext, gradient_fn

SHARED, STACKED, PACKED = 0, 1, 2
"""How a step input reaches the program (`split_inputs`): once for every step, as
its own stacked row, or as a column of the step's one float32 vector."""


def split_inputs(tree: Any) -> tuple[Any, tuple[bool, ...]]:
    """`(treedef, stacked)`: which leaves of a step-input tree vary per step.

    A host value (a NumPy scalar or array, a Python number: what the plan and the
    schedules compute each step) is stacked along the block's steps; a device array
    (a mask, an anchor, an unscheduled Device field: made once) is shared.
    """
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return treedef, tuple(not isinstance(leaf, jax.Array) for leaf in leaves)


def packs(leaf: Any) -> bool:
    """Whether a host step input travels as a column of the step's float32 vector:
    a float32 scalar (a learning rate, a rule field, a decay), which would otherwise
    cost a transfer and a program argument of its own."""
    return isinstance(leaf, np.generic | np.ndarray) and (
        leaf.dtype == np.float32 and leaf.shape == ()
    )


def merge_inputs(treedef: Any, stacked: tuple[int, ...], shared: Any, step: Any) -> Any:
    """The step-input tree of one step (traced), from the shared leaves and the
    step's slice of the stacked ones, in `split_inputs` order; `stacked` holds each
    leaf's `SHARED`, `STACKED` or `PACKED` (a bool for the first two), and with a
    `PACKED` leaf the step's first stacked input is the vector of them, in order."""
    step = list(step)
    vector: Any = step.pop(0) if PACKED in stacked else None
    shared_it, step_it, column = iter(shared), iter(step), iter(range(len(stacked)))
    leaves = [
        vector[next(column)] if s == PACKED else next(step_it) if s else next(shared_it)
        for s in stacked
    ]
    return jax.tree_util.tree_unflatten(treedef, leaves)


RING_HEAD = 3
"""The ring's first words: the counter `(seed, step, 0)`."""


def new_ring(seed: int, step: int, size: int) -> np.ndarray:
    """A host ring of `size` losses whose counter starts at optimizer `step`."""
    ring = np.zeros(RING_HEAD + size, np.uint32)
    ring[:RING_HEAD] = (seed % 2**32, step % 2**32, 0)
    return ring


def ring_losses(ring: Any) -> np.ndarray:
    """The float32 losses of a ring read back (a view, no copy).

    >>> ring = new_ring(0, 0, 2)
    >>> ring[3:] = np.array([1.5, 2.0], np.float32).view(np.uint32)
    >>> ring_losses(ring).tolist()
    [1.5, 2.0]
    """
    return np.asarray(ring)[RING_HEAD:].view(np.float32)


@functools.lru_cache(maxsize=8)
def call_positions(block_steps: int) -> tuple[jax.Array, ...]:
    """int32 device scalars 0..K, placed once per process: a call's `start` and
    `count` are handles to these, so a dispatch transfers no position."""
    return tuple(jax.device_put([np.int32(i) for i in range(block_steps + 1)]))


def _at(tree: Any, index: Any) -> Any:
    """Every leaf of `tree` at `index` (traced) of its leading axis."""
    return jax.tree.map(
        lambda leaf: jax.lax.dynamic_index_in_dim(leaf, index, keepdims=False), tree
    )


StepBody = Callable[..., tuple[Any, Any, Any, Any]]
"""One optimizer step, traced into the train program: `(device_values, Weights,
model_state, accumulator, batch, hp, rng) -> (Weights, model_state, accumulator,
StepOutputs)`; under accumulation `batch` and `rng` hold the step's micro-batches
stacked `(accum, ...)`."""


def automatic_step(
    ctx: TraceContext, fields: GradientFields, accum: int, plan: OptimizerStep
) -> StepBody:
    """The automatic mode's step: the gradient of each micro-batch added into the
    accumulator as `a + g / accum`, then the optimizer step on the accumulated
    gradient and the accumulator zeroed (at accum 1, the gradient goes straight
    into the optimizer step)."""
    compute = gradient_fn(ctx, fields, plan)
    scale = 1.0 / accum

    def one_step(device_values, weights, state, accumulator, batch, hp, rng):
        if accum == 1:
            grads, state, reported = compute(
                device_values, weights.params, state, batch, hp.grad, rng
            )
            view = ctx.make_view(device_values)
            return plan.apply(view, weights, grads, hp), state, accumulator, reported

        def micro(carry, xs):
            accumulator, state = carry
            micro_batch, micro_rng = xs
            grads, state, reported = compute(
                device_values, weights.params, state, micro_batch, hp.grad, micro_rng
            )
            accumulator = jax.tree.map(lambda a, g: a + g * scale, accumulator, grads)
            return (accumulator, state), reported

        (accumulator, state), reported = jax.lax.scan(
            micro, (accumulator, state), (batch, rng)
        )
        view = ctx.make_view(device_values)
        weights = plan.apply(view, weights, accumulator, hp)
        return weights, state, jax.tree.map(jnp.zeros_like, accumulator), reported

    return one_step


class TrainCallArgs(NamedTuple):
    """The train program's arguments (module docstring), in the order it takes
    them: `executable(*TrainCallArgs(...))`."""

    values_shared: Any  # the Device fields every step shares (device arrays)
    values_steps: Any  # every Device field stacked (K, ...)
    weights: Any  # Weights, or packed the state's flat buffers; donated
    model_state: Any  # the model's state, or () packed
    accumulator: Any  # the gradient accumulator, or () packed; donated
    block: Any  # the block's batches: (K, B, ...), or (K, accum, B, ...)
    hp_shared: Any  # the optimizer inputs every step shares (masks, anchors)
    hp_steps: Any  # the host-made optimizer inputs stacked (K, ...)
    start: Any  # int32[]: the call's first block position
    count: Any  # int32[]: the call's steps
    ring: Any  # uint32[3 + T]: the step counter and the loss ring


def _step_rng(seed: Any, step: Any, accum: int, micro_index: np.ndarray) -> Any:
    """The counter `step_rng()` folds for optimizer `step` (traced): `(seed, step,
    0)`, or under accumulation one `(seed, step, micro)` row per micro-batch."""
    if accum == 1:
        return jnp.stack([seed, step, jnp.uint32(0)])
    return jnp.stack(
        [
            jnp.full((accum,), seed),
            jnp.full((accum,), step),
            jnp.asarray(micro_index),
        ],
        axis=-1,
    )


def _record_losses(
    ring: Any, step: Any, loss: Any, accum: int, micro_index: np.ndarray
) -> Any:
    """`ring` with optimizer `step`'s micro-batch losses written as float32 bits at
    their places in the loss ring (module docstring)."""
    size = ring.shape[0] - RING_HEAD
    rows = RING_HEAD + (step * accum + micro_index) % size
    losses = jnp.reshape(loss, (accum,)).astype(jnp.float32)
    bits = jax.lax.bitcast_convert_type(losses, jnp.uint32)
    return ring.at[rows.astype(jnp.int32)].set(bits)


def _without_loss(reported: Any) -> Any:
    """A step's `StepOutputs` as the program returns them: the loss travels in the
    ring alone."""
    return reported._replace(loss=None)


def _packed(
    packing: Packing | None, weights: Any, state: Any, accumulator: Any
) -> tuple[Any, Any, Any]:
    """The state as the program returns it: as it is, or packed into its flat
    buffers in the Weights' place with `()` in the other two."""
    if packing is None:
        return weights, state, accumulator
    return packing.pack((weights, state, accumulator)), (), ()


def scanned_fn(
    one_step: StepBody,
    accum: int,
    layout: tuple[Any, tuple[int, ...], Any, tuple[int, ...]],
    *,
    single: bool = False,
    packing: Packing | None = None,
) -> Callable:
    """The train program running `one_step` (`automatic_step`, or manual mode's
    own step) for `accum` micro-batches per step (module docstring).

    `layout`: `(values_treedef, values_stacked, hp_treedef, hp_stacked)` from
    `split_inputs`, fixed for the program (it is part of its key). `single`: every
    call runs one step (steps_per_call=1), so the program runs it without a loop
    (`count` is ignored) and reports it stacked `(1, ...)`: a loop of one cost a
    CPU step about 10% (its carried state copied in and out; not so for a state
    packed around each step, whose one-step calls take the loop). `packing`: the
    state `(Weights, model_state, accumulator)` comes in and goes out as its flat
    buffers (`compile/packed.py`), in the Weights' place, with `()` in the other
    two; unpacked and packed around each step where `packing.each_step`.
    """
    values_def, values_stacked, hp_def, hp_stacked = layout
    micro_index = np.arange(accum, dtype=np.uint32)

    def program(
        values_shared,
        values_steps,
        weights,
        state,
        accumulator,
        block,
        hp_shared,
        hp_steps,
        start,
        count,
        ring,
    ):
        # Packed around the call's loop, or around each step (`Packing.each_step`).
        around_call = None if packing is None or packing.each_step else packing
        around_step = packing if packing is not None and packing.each_step else None
        if around_call is not None:
            weights, state, accumulator = around_call.unpack(weights)
        seed, first = ring[0], ring[1]

        def inputs(j):
            at = start + j
            values = merge_inputs(
                values_def, values_stacked, values_shared, _at(values_steps, at)
            )
            hp = merge_inputs(hp_def, hp_stacked, hp_shared, _at(hp_steps, at))
            step = first + j.astype(jnp.uint32)
            rng = _step_rng(seed, step, accum, micro_index)
            return values, _at(block, at), hp, rng, step

        def run(j, weights, state, accumulator):
            values, batch, hp, rng, step = inputs(j)
            if around_step is None:
                return one_step(
                    values, weights, state, accumulator, batch, hp, rng
                ), step
            weights, state, accumulator, reported = one_step(
                values, *around_step.unpack(weights), batch, hp, rng
            )
            packed = _packed(around_step, weights, state, accumulator)
            return (*packed, reported), step

        def record(ring, step, reported):
            return _record_losses(ring, step, reported.loss, accum, micro_index)

        if single:  # every call is one step: no loop around it
            (weights, state, accumulator, reported), step = run(
                jnp.int32(0), weights, state, accumulator
            )
            stacked = jax.tree.map(lambda x: x[None], _without_loss(reported))
            ring = record(ring, step, reported).at[1].add(jnp.uint32(1))
            return (*_packed(around_call, weights, state, accumulator), stacked, ring)

        steps = jax.tree.leaves(block)[0].shape[0]
        if steps == 1:
            # Looped over as a block of two (its inputs repeated; the call's count
            # stays 1): XLA specializes a loop over a block of one position, and
            # there a packed state's update rounded differently in the last bit
            # from the same step in a longer block (measured on a CPU).
            block, values_steps, hp_steps = _twice((block, values_steps, hp_steps))
        # The reported tree's shapes, for the stacked buffers the loop fills.
        shapes = jax.eval_shape(
            lambda: _without_loss(run(jnp.int32(0), weights, state, accumulator)[0][3])
        )
        rows = max(steps, 2)
        stacked = jax.tree.map(lambda s: jnp.zeros((rows, *s.shape), s.dtype), shapes)

        def body(j, carry):
            weights, state, accumulator, stacked, ring = carry
            (weights, state, accumulator, reported), step = run(
                j, weights, state, accumulator
            )
            stacked = jax.tree.map(
                lambda buf, x: jax.lax.dynamic_update_index_in_dim(buf, x, j, 0),
                stacked,
                _without_loss(reported),
            )
            return weights, state, accumulator, stacked, record(ring, step, reported)

        weights, state, accumulator, stacked, ring = jax.lax.fori_loop(
            0, count, body, (weights, state, accumulator, stacked, ring)
        )
        ring = ring.at[1].add(count.astype(jnp.uint32))
        stacked = jax.tree.map(lambda rows: rows[:steps], stacked)
        return (*_packed(around_call, weights, state, accumulator), stacked, ring)

    return program


def _twice(tree: Any) -> Any:
    """Every leaf of `tree` stacked on itself along its leading axis."""
    return jax.tree.map(lambda leaf: jnp.concatenate([leaf, leaf]), tree)
