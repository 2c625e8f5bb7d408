"""What one epoch's calls leave for the next, so an epoch starts without placing
anything: the train state's flat buffers (`compile/packed.py`), the counter and
loss ring, the block positions, the placed step inputs. Each placement cost
170-310 us on a TPU host, and a short epoch pays it in full.

The calls loop (`calls.py`) carries the state in its calls' form: the trees
`(Weights, model_state, accumulator)` as they are, or packed into flat buffers
(`carry_in`), and hands the handle the trees again at every commit
(`carry_out`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import numpy as np

from ..compile.packed import (
    PACK_MOST_BYTES,
    Packing,
    PackRule,
    pack_program,
    packing_of,
    unpack_program,
)
from ..compile.scanned import RING_HEAD, call_positions, new_ring
from ..devices.placement import Placement
from .step_programs import CallInputs, current_state

CARRIED: dict[str, Any] = {}
"""What one epoch's calls leave for the next, so an epoch starts without placing
anything (each placement cost 170-310 us on a TPU, and a short epoch pays it in
full): "packed" a `HeldState`, "ring" `((seed, step, size), ring)`, the counter
and loss ring, "inputs" `(plan, device values, K, CallInputs)` of a plan with no
varying schedule."""


class HeldState(NamedTuple):
    """How an epoch left the train state for the next (`CARRIED["packed"]`)."""

    rule: PackRule
    """The packing rule it was decided by."""
    packing: Packing | None
    """Its packing; None: it travels as it is (too large, or not packable)."""
    tree_ids: tuple[int, ...]
    """The ids of the trees the handle was handed (`state_trees`). Packed, `kept`
    holds those trees, so an id names one of them. Unpacked nothing is kept (a
    large state is not held past its handle), and the decision holds only within
    its `train()`, where the model is the same: there an id reused by a new tree
    names a tree of the same shapes, judged the same."""
    kept: tuple[Any, ...]
    """The trees, while packed; () unpacked."""
    carry: tuple[Any, ...]
    """The calls' state arguments while packed (the flat buffers, (), ()); ()
    unpacked."""
    train: object = None
    """Unpacked, the `train()` that judged it (its `EpochContext.programs`, one
    object per `train()`, held like "inputs" until another train() replaces it):
    another train(), whose weights may reuse the ids of a state gone since,
    judges its own; None packed."""

    @classmethod
    def of(
        cls,
        rule: PackRule,
        packing: Packing | None,
        state: Any,
        carry: Any,
        train: object,
    ) -> HeldState:
        """How `state` (committed) and the calls' `carry` are held at the end of
        an epoch of `train` (`EpochContext.programs`)."""
        trees = state_trees(state)
        ids = tuple(map(id, trees))
        if packing is None:
            return cls(rule, None, ids, (), (), train)
        return cls(rule, packing, ids, trees, carry)

    def holds(self, rule: PackRule, trees: tuple[Any, ...], train: object) -> bool:
        """Whether this decision (and these buffers) stand for `trees` packed by
        `rule` in `train`."""
        if self.rule != rule or self.tree_ids != tuple(map(id, trees)):
            return False
        return self.packing is not None or self.train is train


def _placed(value: Any, placement: Placement | None) -> Any:
    """`value` on the device, or replicated over the run's mesh."""
    if placement is None:
        return jax.device_put(value)
    return placement.place(value, "replicated")


def carried_ring(seed: int, step: int, size: int, placement: Placement | None) -> Any:
    """The device ring of `size` losses with the counter `(seed, step, 0)`
    (`compile/scanned.py`): the last epoch's, when it ended there (its old losses
    are never read)."""
    held = CARRIED.get("ring")
    if held is not None and held[0] == (seed % 2**32, step, size):
        return held[1]
    return _placed(new_ring(seed, step, size), placement)


def hold_ring(seed: int, step: int, ring: Any) -> None:
    """Leave the device `ring` an epoch ended with at optimizer `step` for the
    next epoch's `carried_ring`."""
    losses = ring.shape[0] - RING_HEAD
    CARRIED["ring"] = ((seed % 2**32, step, losses), ring)


def carried_inputs(plan: Any, device: Any, size: int) -> CallInputs | None:
    """The step inputs the last epoch placed for blocks of `size` steps under
    `plan` (one with no varying schedule) and the Device values `device`, if it
    left them."""
    held = CARRIED.get("inputs")
    if held is None or held[0] is not plan or held[1] is not device:
        return None
    return held[3] if held[2] == size else None


def hold_inputs(plan: Any, device: Any, size: int, inputs: CallInputs) -> None:
    """Leave the step inputs placed for `plan` (no varying schedule), `device`
    and blocks of `size` steps to the epochs after (`carried_inputs`)."""
    CARRIED["inputs"] = (plan, device, size, inputs)


def carried_positions(size: int, placement: Placement | None) -> tuple[Any, ...]:
    """The block positions 0..size as device scalars (`call_positions`), on the
    run's mesh when there is one."""
    if placement is None:
        return call_positions(size)
    held = CARRIED.get("positions")
    if held is None or held[0] != (size, placement.key()):
        values = _placed([np.int32(i) for i in range(size + 1)], placement)
        held = CARRIED["positions"] = ((size, placement.key()), tuple(values))
    return held[1]


HOST_PACK_BYTES = PACK_MOST_BYTES
"""A state of at most this many bytes on one device (every state packed there) is
packed through the host: the pack program compiles on its first use in a process,
0.18 s of a TPU v5e tutorial MLP's first step and 0.42 s of the compute-bound
MLP's (a 22 MB state), where reading back and placing tens of megabytes takes tens
of milliseconds, and a state is packed about once a `train()`."""


def packed_flats(packing: Packing, trees: Any) -> tuple[Any, ...]:
    """The flat buffers of `trees` on their device: copied through the host when
    they are small and on one device, else by the pack program."""
    leaves = jax.tree.leaves(trees)
    devices = {
        frozenset(leaf.devices()) if isinstance(leaf, jax.Array) else None
        for leaf in leaves
    }
    if packing.nbytes <= HOST_PACK_BYTES and len(devices) == 1:
        (placed_on,) = devices
        if placed_on is not None and len(placed_on) == 1:
            (device,) = placed_on
            return tuple(jax.device_put(f, device) for f in packing.pack_on_host(trees))
    return pack_program(packing)(trees)


def hold_state(
    rule: PackRule | None,
    packing: Packing | None,
    state: Any,
    carry: Any,
    train: object,
) -> None:
    """Leave how an epoch of `train` (`EpochContext.programs`) passed the state it
    committed, `state` (packed by `rule`, or not: `packing`), and its calls' state
    arguments `carry`, for the next epoch's `carry_in`; nothing where nothing packs
    (`rule` None)."""
    if rule is not None:
        CARRIED["packed"] = HeldState.of(rule, packing, state, carry, train)


def state_trees(state: Any) -> tuple[Any, Any, Any]:
    """A TrainState's `(Weights, model_state, accumulator)`: what a call carries."""
    return state.weights, state.model_state, state.accumulator


def same_trees(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return all(x is y for x, y in zip(a, b, strict=True))


def carry_in(
    state: Any, rule: PackRule | None, train: object
) -> tuple[Packing | None, tuple[Any, Any, Any]]:
    """How the calls pass `state`, and their state arguments (`compile/scanned.py`):
    `(None, its trees)`, or packed by `rule` (`compile/packed.py`; None: never) its
    packing and flat buffers. The last epoch's decision and buffers (`HeldState`)
    when the handle still holds the trees it was handed (a decision to leave the
    state unpacked: in the same `train`, `EpochContext.programs`), so an epoch starts
    without a dispatch or a walk of the trees (that walk cost a short epoch about
    0.3 ms on the chip's host, and 0.17 ms on a CPU for a state left unpacked)."""
    trees = state_trees(state)
    held: HeldState | None = CARRIED.pop("packed", None)
    if rule is None:
        return None, trees
    if held is None or not held.holds(rule, trees, train):
        packing = packing_of(trees, rule.most_bytes, rule.each_step)
        if packing is None:  # too large, or leaves that have no buffer
            return None, trees
        carry = packed_flats(packing, trees), (), ()
    elif held.packing is None:  # judged too large or not packable last epoch
        return None, trees
    else:
        packing, carry = held.packing, held.carry
    # What the first call would donate unpacked (the Weights and the accumulator)
    # is released now, as a donation releases it: the flat buffers hold the state.
    for leaf in jax.tree.leaves((state.weights, state.accumulator)):
        if isinstance(leaf, jax.Array) and not leaf.is_deleted():
            leaf.delete()
    return packing, carry


_UNPACKED: set[Packing] = set()
"""The packings whose unpack program has run in this process (it compiled)."""


def unpacks_at_once(packing: Packing | None) -> bool:
    """Whether `carry_out` hands the state back without compiling anything: the
    state is not packed, or its unpack program has run before in this process."""
    return packing is None or packing in _UNPACKED


def carry_out(
    start: Any, carry: tuple[Any, Any, Any], step: int, packing: Packing | None
) -> Any:
    """The training state the calls have reached, as the handle holds it (new
    buffers: packed ones stay valid for the next call)."""
    if packing is None:
        return current_state(start, *carry, step)
    if any(flat.is_deleted() for flat in carry[0]):
        # A call that failed after taking them (its donation): the state is gone,
        # as an unpacked call's would be; unpacking now would hide the failure.
        return current_state(start, *state_trees(start), step)
    weights, model_state, accumulator = unpack_program(packing)(carry[0])
    _UNPACKED.add(packing)
    return current_state(start, weights, model_state, accumulator, step)
