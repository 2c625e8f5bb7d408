"""The training executables the hot loops run, and the inputs they take per step.

`call_program` gives the train program, one to K optimizer steps per dispatch (the
automatic step or manual mode's own, on one device or a mesh, in one process or
several: `compile/scanned.py`), and
`call_inputs` builds what it takes for one block of K steps: every host-made step
input (schedule values, the gradient rule's fields, the EMA's decay) computed on the
host for each step and stacked, every Device field stacked (scheduled or not, so a
schedule compiles nothing), all placed with one transfer, and the device-resident
optimizer inputs (masks, anchors) passed once.
"""

from __future__ import annotations

import weakref
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from ..compile.declaration import Program
from ..compile.kinds import MANUAL_STEP, TRAIN_STEP, train_layout
from ..compile.packed import Packing
from ..compile.scanned import (
    PACKED,
    SHARED,
    STACKED,
    StepBody,
    TrainCallArgs,
    automatic_step,
    packs,
    split_inputs,
)
from ..data.sources import batch_size
from ..devices.placement import Placement
from ..errors import ConfigError, NitroError
from ..optim.plan import OptimizerPlan, scheduled_devices
from ..optim.schedules import Target
from .manual import manual_call_step

if TYPE_CHECKING:
    from .context import EpochContext
    from .prepared import Prepared
    from .state import TrainState


def check_batch(
    host: dict[str, np.ndarray],
    names: tuple[str, ...],
    expected: int,
    index: int,
    epoch: int,
) -> None:
    """Refuse a train batch of another size (a partial batch met mid-epoch)."""
    for name in names:
        if host[name].shape[:1] != (expected,):
            size = batch_size(host, names)
            raise ConfigError(
                f"Train batch {index} of epoch {epoch} holds {size} samples, the "
                f"first held {expected}. The train split must drop its partial last "
                f"batch and keep one batch size (drop_remainder=True / "
                f"drop_last=True)."
            )


def device_inputs(
    prepared: Prepared, device: dict[str, Any], current: dict[Target, float]
) -> dict[str, Any]:
    """The Device fields `device` with the scheduled ones overridden by NumPy values
    from `current`, the step's `schedule_values`."""
    scheduled = prepared.device_schedules
    if not scheduled:
        return device
    return {**device, **scheduled_devices(current, scheduled)}


def current_state(
    start: TrainState, weights: Any, model_state: Any, accumulator: Any, step: int
) -> TrainState:
    """The training state the hot loop holds in locals, as one value."""
    return start._replace(
        weights=weights, model_state=model_state, accumulator=accumulator, step=step
    )


@dataclass(frozen=True)
class CallInputs:
    """What the calls over one block take beside the state and the stacked batches.

    Attributes:
        values_shared / values_steps: the Device fields, the device-resident ones
            once and the host-made ones (the scheduled fields) stacked `(K, ...)`,
            placed on the device.
        hp_shared / hp_steps: the optimizer step inputs, split the same way.
        layout: how each leaf travels (`compile.scanned`: shared, stacked or
            packed), `(values_treedef, values_stacked, hp_treedef, hp_stacked)`;
            part of the program's memo.
        schedule_values: each block step's `schedule_values`, for its train line.
    """

    values_shared: list[Any]
    values_steps: list[Any]
    hp_shared: list[Any]
    hp_steps: list[Any]
    layout: tuple[Any, tuple[int, ...], Any, tuple[int, ...]]
    schedule_values: list[dict[Target, float]]


SHARED_CHANGED = (
    "Step input {path} is a device array that changed between optimizer steps {a} "
    "and {b} of one block of steps; a call passes device-resident step inputs once "
    "a block. Report this: the plan should make it a host value."
)


_BROADCAST: dict[tuple[int, int], tuple[Any, Any]] = {}


def _rows(leaf: jax.Array, size: int) -> jax.Array:
    """A device array repeated `size` times along a new leading axis, made once
    while the array lives (a Device field keeps its value until `set_device`)."""
    held = _BROADCAST.get((id(leaf), size))
    if held is not None and held[0] is leaf:
        return held[1]
    if len(_BROADCAST) > 64:
        _BROADCAST.clear()
    rows = jax.numpy.broadcast_to(leaf[None], (size, *leaf.shape))
    _BROADCAST[(id(leaf), size)] = (leaf, rows)
    return rows


def _split(
    trees: list[Any],
    first: int,
    size: int,
    *,
    every_leaf: bool = False,
    pack: bool = False,
) -> tuple[Any, tuple[int, ...], list, list]:
    """`(treedef, stacked, shared leaves, stacked leaves)` of the per-step `trees`,
    each stacked leaf padded to `size` rows with its last one (rows no call reaches)
    and placed on the device with one transfer. `every_leaf` stacks the device
    leaves too (each repeated), so the layout does not follow which are host-made.
    `pack` gathers the host float32 scalars into one `(size, n)` array, first among
    the stacked leaves (`compile.scanned.PACKED`): a transfer and a program
    argument each would cost more than the values."""
    treedef, host = split_inputs(trees[0])
    flat = [jax.tree_util.tree_leaves(t) for t in trees]
    flat += [flat[-1]] * (size - len(flat))
    packed = [pack and h and packs(leaf) for leaf, h in zip(flat[0], host, strict=True)]
    stacked = tuple(
        PACKED if p else STACKED if every_leaf or h else SHARED
        for p, h in zip(packed, host, strict=True)
    )
    for i, is_host in enumerate(host):  # a device leaf must stay the same array
        for n, leaves in enumerate(flat[1 : len(trees)], start=1):
            if not is_host and leaves[i] is not flat[0][i]:
                raise NitroError(SHARED_CHANGED.format(path=i, a=first, b=first + n))
    shared = [leaf for leaf, s in zip(flat[0], stacked, strict=True) if not s]
    columns = [i for i, p in enumerate(packed) if p]
    rows = [np.array([[leaves[i] for i in columns] for leaves in flat], np.float32)]
    rows = rows[: bool(columns)] + [
        np.stack([np.asarray(leaves[i]) for leaves in flat])
        for i, h in enumerate(host)
        if h and not packed[i]
    ]
    placed = iter(jax.device_put(rows))  # the host-made rows: one transfer
    steps: list[Any] = [next(placed)] if columns else []
    steps += [
        next(placed) if is_host else _rows(flat[0][i], size)
        for i, is_host in enumerate(host)
        if stacked[i] == STACKED
    ]
    return treedef, stacked, shared, steps


def call_inputs(
    prepared: Prepared,
    plan: OptimizerPlan,
    device: dict[str, Any],
    first: int,
    length: int,
    size: int,
    placement: Placement | None = None,
) -> CallInputs:
    """The inputs of the calls over a block of `size` steps whose first `length`
    run optimizer steps `first` to `first + length - 1` (0-based, global), with
    Device fields `device`; replicated over the run's mesh when there is one (a
    program on a mesh would otherwise place them again at every call)."""
    schedule = [plan.schedule_values(s) for s in range(first, first + length)]
    hps = [plan.step_inputs(first + i, v) for i, v in enumerate(schedule)]
    values = [device_inputs(prepared, device, v) for v in schedule]
    # Every Device field is stacked, scheduled or not: which fields a run schedules
    # must not change the program (a Device field schedules without a compile).
    vdef, vstacked, vshared, vsteps = _split(values, first, size, every_leaf=True)
    hdef, hstacked, hshared, hsteps = _split(hps, first, size, pack=True)
    schedule += schedule[-1:] * (size - length)  # rows no call reaches, as above
    if placement is not None:
        vshared, vsteps, hshared, hsteps = placement.place(
            [vshared, vsteps, hshared, hsteps], "replicated"
        )
    return CallInputs(
        vshared, vsteps, hshared, hsteps, (vdef, vstacked, hdef, hstacked), schedule
    )


def _step_program(prepared: Prepared, accum: int) -> tuple[Program, StepBody]:
    """The train program of the run's mode as this run compiles it, and its step
    body: the automatic step over its plan, or manual mode's own `train_step`."""
    ctx = prepared.ctx
    plan = prepared.plan
    assert plan is not None
    layout = train_layout(accum)
    if prepared.manual:
        names = prepared.routing.train_fields
        exposed = plan.manual_targets
        body = manual_call_step(ctx, names, exposed)
        manual = {"fields": names, "exposed": exposed}
        return MANUAL_STEP.running(manual, layout=layout), body
    fields = prepared.routing.gradient_fields
    assert fields is not None  # routed at setup for a run with a train split
    traced = TRAIN_STEP.traced + (
        ("train_metrics",) if fields.train_metrics is not None else ()
    )
    baked = {
        "fields": fields,
        "inv_accum": 1.0 / accum,
        **plan.constants(),
        **plan.gradient_constants(),
    }
    program = TRAIN_STEP.running(baked, traced=traced, layout=layout)
    return program, automatic_step(ctx, fields, accum, plan)


_DECLARED: dict[int, dict[Hashable, Any]] = {}
"""Per setup (a `Prepared`, by identity, dropped when it is collected), the train
programs its epochs declared, and what each was declared from: declaring one keys
its constants (`typed_key`), about 0.2 ms, which a short epoch paid again each time
(6% of a 64-step CPU epoch of the tiny MLP)."""


def _memo_of(prepared: Prepared) -> dict[Hashable, Any]:
    memo = _DECLARED.get(id(prepared))
    if memo is None:
        memo = _DECLARED[id(prepared)] = {}
        weakref.finalize(prepared, _DECLARED.pop, id(prepared), None)
    return memo


def _declared(
    prepared: Prepared, accum: int, layout: Any, single: bool, packing: Any
) -> tuple[Program, StepBody]:
    """The train program and its step body for these calls: the last epoch's when
    the optimizer's constants it was declared from are still equal."""
    plan = prepared.plan
    assert plan is not None
    made = plan.constants(), plan.gradient_constants()
    memo = _memo_of(prepared)
    key = (accum, layout, single, packing)
    held = memo.get(key)
    if held is not None and held[0] == made:
        return held[1], held[2]
    program, body = _step_program(prepared, accum)
    program = program.running({"layout": layout, "single": single, "packing": packing})
    memo[key] = (made, program, body)
    return program, body


def call_program(
    context: EpochContext,
    args: TrainCallArgs,
    inputs: CallInputs,
    *,
    single: bool,
    packing: Packing | None,
) -> Any:
    """The train program for calls taking `args` (`args.block`'s leading axis is
    the block's step count), from the handle or the cache (`compile/scanned.py`):
    the automatic step, or in manual mode the experiment's own `train_step`;
    `inputs`: the block's inputs `args` holds (their layout keys the program);
    `single`: every call runs one step (steps_per_call=1); `packing`: the state
    travels packed (`compile/packed.py`). An earlier epoch of the same `train()`
    found it already for calls taking the same (`EpochContext.programs`): keying
    it again cost a short epoch about 80 us on a CPU host."""
    shapes = tuple((k, v.shape, str(v.dtype)) for k, v in args.block.items())
    # The manual optimizer states' transformations live in the Weights' tree
    # structure: the memo sees them there, as the compile key does.
    structure = jax.tree.structure(args.weights)
    varying = (shapes, context.accum, inputs.layout, args.ring.shape, structure)
    takes = (varying, single, packing)
    found = context.programs.get(takes)
    if found is None:
        found = context.programs[takes] = _looked_up(
            context, args, inputs, varying, single=single, packing=packing
        )
    return found


def _looked_up(
    context: EpochContext,
    args: TrainCallArgs,
    inputs: CallInputs,
    varying: Hashable,
    *,
    single: bool,
    packing: Packing | None,
) -> Any:
    """`call_program`'s program from the handle's memo or the compile cache, the
    program declared from the optimizer's constants of now."""
    accum = context.accum
    program, body = _declared(context.prepared, accum, inputs.layout, single, packing)
    return program.executable(
        context.executables,
        context.prepared.ctx,
        args,
        varying,
        body,
        accum,
        inputs.layout,
        single=single,
        packing=packing,
    )
