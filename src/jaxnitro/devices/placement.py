"""`Placement`: the data-parallel mesh of a run with n_devs > 1, and where each value
of a program goes on it.

One mesh axis, "data", over the first n_devs visible devices. The batch is split
along its first axis; the training state (params, optimizer state, EMA, the gradient
accumulator) is replicated, or under `sharding="fsdp"` each large leaf is split
along its largest dimension that divides by n_devs, so that a device holds about
1/n_devs of the model. Everything else a program takes (Device fields, step
hyperparameters, the model state) is replicated. XLA's SPMD partitioner inserts the
collectives: the gradient's all-reduce, and under fsdp the all-gathers of the
parameters. A run with n_devs == 1 has no placement and no mesh.

    >>> import jax
    >>> placement = Placement.build(n_devs=1, mode="replicated")
    >>> placement.n_devs, placement.mode
    (1, 'replicated')
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, Literal

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ..errors import ConfigError
from .process import backend_name, visible_devices

AXIS = "data"
# The values a program takes, by where they go on the mesh. A block (the calls loop's
# stacked batches) has its batch axis second, `(K, B, ...)`, or third under
# accumulation, `(K, accum, B, ...)`: "block" and "accum_block".
Role = Literal["batch", "block", "accum_block", "state", "replicated"]
_BATCH_AXIS = {"batch": 0, "block": 1, "accum_block": 2}
SHARDING_MODES = ("replicated", "fsdp")
# Leaves smaller than this stay whole on every device under fsdp: splitting a bias
# saves nothing and costs a collective each step.
FSDP_MIN_ELEMENTS = 1024

SHARDING_VALUE = (
    'sharding={value!r} (from the {source}): it is "replicated" (every device '
    'holds the whole model; the default) or "fsdp" (parameters, optimizer state and '
    "EMA split along the data axis)."
)
BATCH_DIVIDES = (
    "The train batch holds {size} samples, which does not divide by n_devs={n_devs} "
    "({size} % {n_devs} = {rest}): the batch size is global and is split evenly "
    "across the devices. Use a batch size that is a multiple of {n_devs} (e.g. "
    "{lower} or {upper}), or an n_devs that divides {size}."
)

PROCESS_BATCH_DIVIDES = (
    "Each of the {world} processes feeds train batches of {size} samples (a global "
    "batch of {total} over {world} x {n_devs} devices), and {size} does not divide "
    "by its n_devs={n_devs} ({size} % {n_devs} = {rest}): each process splits its "
    "part evenly across its own devices. Feed a multiple of {n_devs} per process "
    "(a global batch that divides by {devices}), or choose n_devs to divide {size}."
)


def mesh_devices(n_devs: int) -> list[Any]:
    """The devices of a run's mesh: the first `n_devs` of this process's, and in a
    run across processes the first `n_devs` of every process's, rank by rank (so
    each process's part of the batch lands on its own devices)."""
    local = visible_devices()
    if jax.process_count() == 1:
        return local[:n_devs]
    by_process: dict[int, list[Any]] = {}
    for device in jax.devices(backend_name()):
        by_process.setdefault(device.process_index, []).append(device)
    return [d for p in sorted(by_process) for d in by_process[p][:n_devs]]


def put(tree: Any, shardings: Any) -> Any:
    """`jax.device_put(tree, shardings)`, without its check across processes.

    In a run across processes JAX checks, with a collective per leaf, that a value
    sent to a sharding over every process's devices is the same on each; the
    programs' small host inputs (step hyperparameters, the step's key data) would
    pay several of those each step. Every process computes those values alike, so
    a strongly typed numeric leaf is placed from this process's copy instead; a
    weakly typed or key leaf, or a leaf already spread over the processes, goes
    through `jax.device_put`.
    """
    if jax.process_count() == 1:
        return jax.device_put(tree, shardings)
    return jax.tree.map(_put_alike, tree, shardings)


def _put_alike(value: Any, sharding: Any) -> Any:
    if (
        sharding.is_fully_addressable
        or (isinstance(value, jax.Array) and not value.is_fully_addressable)
        or getattr(value, "weak_type", False)
        or isinstance(value, bool | int | float | complex)  # weakly typed in JAX
        or jax.dtypes.issubdtype(getattr(value, "dtype", None), jax.dtypes.extended)
    ):
        return jax.device_put(value, sharding)
    host = np.asarray(value)
    return jax.make_array_from_callback(host.shape, sharding, lambda at: host[at])


def check_sharding(value: Any, source: str) -> str:
    """The `sharding` run keyword: "replicated" or "fsdp"."""
    if not isinstance(value, str) or value not in SHARDING_MODES:
        raise ConfigError(SHARDING_VALUE.format(value=value, source=source))
    return value


def check_batch_divides(size: int, n_devs: int) -> None:
    """Refuse a global train batch of `size` samples that n_devs does not divide."""
    rest = size % n_devs
    if rest:
        lower = max(n_devs, size - rest)
        raise ConfigError(
            BATCH_DIVIDES.format(
                size=size, n_devs=n_devs, rest=rest, lower=lower, upper=lower + n_devs
            )
        )


def check_process_batch_divides(size: int, n_devs: int, world: int) -> None:
    """Refuse a per-process train batch of `size` samples that the process's
    n_devs devices cannot split: the global batch, `size * world`, must divide by
    the `world * n_devs` devices of the mesh."""
    if world == 1:
        check_batch_divides(size, n_devs)
        return
    rest = size % n_devs
    if rest:
        raise ConfigError(
            PROCESS_BATCH_DIVIDES.format(
                world=world,
                size=size,
                total=size * world,
                n_devs=n_devs,
                rest=rest,
                devices=world * n_devs,
            )
        )


def padded_width(width: int, n_devs: int) -> int:
    """The eval batch width rounded up to a multiple of n_devs, so a padded batch
    splits evenly across the devices (the padding is sliced off again)."""
    return -(-width // n_devs) * n_devs


@dataclass(frozen=True)
class Placement:
    """A run's mesh and its sharding rules.

    Attributes:
        mesh: the one-axis ("data") mesh over the run's devices.
        mode: "replicated" or "fsdp", how the training state is laid out.
    """

    mesh: Mesh
    mode: str

    @classmethod
    def build(cls, *, n_devs: int, mode: str) -> Placement:
        """The mesh over the first `n_devs` visible devices; in a run across
        processes, over the first `n_devs` of each process's, by rank."""
        devices = np.array(mesh_devices(n_devs))
        return cls(Mesh(devices, (AXIS,)), check_sharding(mode, "caller"))

    @property
    def n_devs(self) -> int:
        """The devices of the mesh."""
        return int(self.mesh.size)

    def key(self) -> Hashable:
        """What a compiled program depends on: the devices and the layout mode."""
        return (tuple(d.id for d in self.mesh.devices.flat), self.mode)

    @property
    def replicated(self) -> NamedSharding:
        """Every device holds the whole value."""
        return NamedSharding(self.mesh, PartitionSpec())

    @property
    def data_sharding(self) -> NamedSharding:
        """Split along the first axis: where a staged batch goes."""
        return NamedSharding(self.mesh, PartitionSpec(AXIS))

    def batch_sharding(self, leaf: Any, axis: int = 0) -> NamedSharding:
        """A batch field split along its batch axis (`axis`: 0, or past a block's
        leading axes); one whose batch axis does not divide is replicated (the eval
        width and the train batch are checked)."""
        shape = np.shape(leaf)
        if len(shape) > axis and shape[axis] % self.n_devs == 0:
            return NamedSharding(self.mesh, PartitionSpec(*[None] * axis, AXIS))
        return self.replicated

    def block_sharding(self, accum: int) -> NamedSharding:
        """Where the calls loop's staged block of batches goes: split along the
        batch axis, `(K, B, ...)` or `(K, accum, B, ...)` (the train batch divides
        by n_devs: setup checks it)."""
        return NamedSharding(
            self.mesh, PartitionSpec(*[None] * (1 if accum == 1 else 2), AXIS)
        )

    def state_sharding(self, leaf: Any) -> NamedSharding:
        """A training-state leaf: replicated, or under fsdp split along its largest
        dimension that divides by n_devs when it is large enough to be worth it."""
        if self.mode != "fsdp":
            return self.replicated
        shape = np.shape(leaf)
        dtype = getattr(leaf, "dtype", None)
        if (
            dtype is None
            or jax.dtypes.issubdtype(dtype, jax.dtypes.extended)  # PRNG keys
            or int(np.prod(shape, dtype=np.int64)) < FSDP_MIN_ELEMENTS
        ):
            return self.replicated
        divisible = [i for i, d in enumerate(shape) if d % self.n_devs == 0]
        if not divisible:
            return self.replicated
        axis = max(divisible, key=lambda i: (shape[i], -i))
        spec: list[str | None] = [None] * len(shape)
        spec[axis] = AXIS
        return NamedSharding(self.mesh, PartitionSpec(*spec))

    def shardings(self, tree: Any, role: Role) -> Any:
        """A sharding for each leaf of `tree`, by its role."""
        if role in _BATCH_AXIS:
            axis = _BATCH_AXIS[role]
            return jax.tree.map(lambda leaf: self.batch_sharding(leaf, axis), tree)
        if role == "state":
            return jax.tree.map(self.state_sharding, tree)
        return jax.tree.map(lambda _: self.replicated, tree)

    def place(self, tree: Any, role: Role) -> Any:
        """`tree` on the mesh as `role` says (a leaf already there is kept)."""
        if tree is None:
            return None
        return put(tree, self.shardings(tree, role))
