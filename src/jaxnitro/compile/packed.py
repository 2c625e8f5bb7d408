"""A small train state passed to a program as one flat buffer per dtype.

Each argument and each result of a call costs the host part of a dispatch: about
7 us a buffer on a TPU v5e host (a jitted function of 16 device scalars returning
16 took 393 us a call, of 64 took 1113 us), about 1.3 us on a CPU. An MLP's weights
and its Adam moments are a dozen buffers in and a dozen out, more than the step's
compute on a small model. The calls loop (`loop/calls.py`) therefore passes a state
of at most `PACK_MOST_BYTES` as one flat array per dtype (the parameters, optimizer
state, model state and accumulator of float32 in one, the step counts of int32 in
another): the program slices its leaves out on entry and concatenates them on exit,
in place of the buffer it donates. A larger state is passed as it is, where copying
it in and out would cost more than the dispatch it saves.

How and how much depends on the backend (`pack_rule`). Off a CPU a state of up to
`PACK_MOST_BYTES` is unpacked once on entry to the call and packed once on exit,
around its loop of steps. On a CPU the copies weigh more against the buffers they
save (a tutorial MLP's 1.2 MB state packed made one step a call 0.72x of the
hand-written loop against 0.95x unpacked), so only a state of up to
`CPU_PACK_MOST_BYTES` is packed (a tiny MLP's 8 KB state took one step a call from
0.66-0.74x to 0.86-1.01x of the hand-written loop, its call from 95 to 55 us).
There it is packed around each step (`Packing.each_step`) and every call runs the
loop's program, a one-step call too (`compile/scanned.py`), so that the step's
arithmetic fuses with the slices and the concatenation alike at every call length:
this keeps the CPU's promise that every steps_per_call trains the same bits.
Measured otherwise: packed around the call's loop, a one-step call fused an EMA's
update with the concatenation; packed around each step but without a loop, a
one-step call of a linear model under Adam; each rounded differently in the last
bit from the same step inside a loop.

    >>> import numpy as np
    >>> tree = {"w": np.ones((2, 2), np.float32), "n": np.int32(3)}
    >>> packing = packing_of(tree)
    >>> [str(d) for d in packing.dtypes]
    ['int32', 'float32']
    >>> back = packing.unpack(packing.pack(tree))
    >>> back["w"].shape, int(back["n"])
    ((2, 2), 3)
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

PACK_MOST_BYTES = 64 * 2**20
"""The largest state packed: copying it into the flat buffers costs about a
microsecond a megabyte of device memory bandwidth, and packing saved a tutorial
MLP's call about 107 us on a TPU v5e (302 to 195 us); above this a model's step is
long enough not to care, and two copies of its state would cost memory."""


CPU_PACK_MOST_BYTES = 256 * 2**10
"""The largest state packed on a CPU: measured one step a call against the
hand-written loop on a 2-core CPU, packing won up to a 247 KB state (0.83x against
0.71x unpacked) and lost from a 427 KB one (0.72x against 0.91x)."""


class PackRule(NamedTuple):
    """How the calls loop packs a train state on a backend (`pack_rule`)."""

    most_bytes: int
    """The largest state packed."""
    each_step: bool
    """Packed around each step rather than around the call's loop of steps."""


ACCELERATOR_PACKING = PackRule(PACK_MOST_BYTES, each_step=False)
CPU_PACKING = PackRule(CPU_PACK_MOST_BYTES, each_step=True)


def pack_rule() -> PackRule:
    """How the calls loop packs a small state on the default backend (module
    docstring)."""
    return CPU_PACKING if jax.default_backend() == "cpu" else ACCELERATOR_PACKING


@dataclass(frozen=True)
class Packing:
    """Where each leaf of a tree lives in the flat buffers (hashable: a program's
    key holds it).

    Attributes:
        treedef: the tree's structure.
        dtypes: one flat buffer per dtype, in this order.
        slots: per leaf `(buffer index, offset, shape)`, in leaf order.
        each_step: the program unpacks and packs the state around each step, not
            once around the call's loop (`PackRule.each_step`).
    """

    treedef: Any
    dtypes: tuple[np.dtype, ...]
    slots: tuple[tuple[int, int, tuple[int, ...]], ...]
    each_step: bool = False

    def __hash__(self) -> int:
        return self._hash

    @functools.cached_property
    def _hash(self) -> int:
        # Computed once: the programs' memos hash a packing at every epoch's edge.
        return hash((self.treedef, self.dtypes, self.slots, self.each_step))

    def pack(self, tree: Any) -> tuple[Any, ...]:
        """The flat buffers of `tree` (traced or concrete)."""
        parts: list[list[Any]] = [[] for _ in self.dtypes]
        for leaf, (buffer, _, _) in zip(
            jax.tree_util.tree_leaves(tree), self.slots, strict=True
        ):
            parts[buffer].append(jnp.ravel(leaf))
        return tuple(
            jnp.concatenate(part) if len(part) > 1 else part[0] for part in parts
        )

    @functools.cached_property
    def nbytes(self) -> int:
        """The bytes of the flat buffers."""
        sizes = [0] * len(self.dtypes)
        for buffer, _, shape in self.slots:
            sizes[buffer] += math.prod(shape)
        return sum(n * d.itemsize for n, d in zip(sizes, self.dtypes, strict=True))

    def pack_on_host(self, tree: Any) -> tuple[np.ndarray, ...]:
        """The flat buffers of `tree` as host arrays, the bits `pack` gives (the
        leaves read back from the device together: their copies overlap)."""
        parts: list[list[Any]] = [[] for _ in self.dtypes]
        leaves = jax.device_get(jax.tree_util.tree_leaves(tree))
        for leaf, (buffer, _, _) in zip(leaves, self.slots, strict=True):
            parts[buffer].append(np.asarray(leaf).ravel())
        return tuple(np.concatenate(part) for part in parts)

    def unpack(self, flats: tuple[Any, ...]) -> Any:
        """The tree whose flat buffers are `flats`."""
        leaves = [
            jax.lax.slice_in_dim(
                flats[buffer], offset, offset + math.prod(shape)
            ).reshape(shape)
            for buffer, offset, shape in self.slots
        ]
        return jax.tree_util.tree_unflatten(self.treedef, leaves)


def packing_of(
    tree: Any, most_bytes: int | None = None, each_step: bool = False
) -> Packing | None:
    """The packing of `tree`'s leaves, or None where it is not worth it or cannot
    be done: more than `most_bytes` (by default `PACK_MOST_BYTES`), no leaves, a
    leaf that is no numeric array (a Python number, a PRNG key array).
    `each_step`: `Packing.each_step`."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    if not leaves:
        return None
    total = 0
    for leaf in leaves:
        dtype = getattr(leaf, "dtype", None)
        if not isinstance(dtype, np.dtype):  # none, or extended (a PRNG key's)
            return None
        total += math.prod(leaf.shape) * dtype.itemsize
    if total > (PACK_MOST_BYTES if most_bytes is None else most_bytes):
        return None
    dtypes: list[np.dtype] = []
    sizes: list[int] = []
    slots = []
    for leaf in leaves:
        dtype = np.dtype(leaf.dtype)
        if dtype not in dtypes:
            dtypes.append(dtype)
            sizes.append(0)
        buffer = dtypes.index(dtype)
        shape = tuple(int(d) for d in leaf.shape)
        slots.append((buffer, sizes[buffer], shape))
        sizes[buffer] += math.prod(shape)
    return Packing(treedef, tuple(dtypes), tuple(slots), each_step)


@functools.lru_cache(maxsize=16)
def pack_program(packing: Packing) -> Any:
    """`tree -> flat buffers` as one jitted program (its inputs stay valid)."""
    return jax.jit(packing.pack)


@functools.lru_cache(maxsize=16)
def unpack_program(packing: Packing) -> Any:
    """`flat buffers -> tree` as one jitted program, into new buffers (the flat
    ones stay valid for the next call)."""
    return jax.jit(packing.unpack)
