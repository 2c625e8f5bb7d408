"""`DeferredMetrics`: a metrics line whose values are still on the device.

The training loop logs a train line on every `log_every_n_steps`-th step. Reading
its device values back (the loss terms, the device `train_metrics`) right then would
put a transfer for each line into the hot loop; instead the loop hands the logger a
`DeferredMetrics` holding the device arrays and the function that turns them into
the line. A logger that takes such lines (`JSONLogger.log_deferred_metrics`) keeps
them until it writes its buffer and reads every held line back in one
`jax.device_get` (`resolve_all`); any other logger gets the line resolved on the spot,
as host values, when it is logged (`protocol.log_deferred`), so what it sees and
when it sees it do not change.

Holding the arrays is safe: they are a program's outputs, which no later program
donates.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax


@dataclass(frozen=True, slots=True)
class DeferredMetrics:
    """A metrics line to build once its device values are on the host.

    Attributes:
        device: a pytree of device arrays (or host values, passed through).
        build: `build(host_tree) -> dict`, the line from `device` read back.

    Examples:
        >>> import jax.numpy as jnp
        >>> line = DeferredMetrics(jnp.float32(0.25), lambda v: {"acc": float(v)})
        >>> line.resolve()
        {'acc': 0.25}
    """

    device: Any
    build: Callable[[Any], dict[str, Any]]

    def resolve(self) -> dict[str, Any]:
        """The line, reading its device values back now (one transfer)."""
        return self.build(jax.device_get(self.device))


def resolve_all(lines: Sequence[DeferredMetrics]) -> list[dict[str, Any]]:
    """Every line of `lines`, their device values read back in one `device_get`.

    Examples:
        >>> import jax.numpy as jnp
        >>> lines = [DeferredMetrics(jnp.int32(i), lambda v: {"i": int(v)})
        ...          for i in range(3)]
        >>> resolve_all(lines)
        [{'i': 0}, {'i': 1}, {'i': 2}]
    """
    if not lines:
        return []
    leaves, structure = jax.tree.flatten([line.device for line in lines])
    # Lines with nothing on the device (train lines without loss terms or device
    # train_metrics, the usual ones) skip JAX: at an epoch's end, with the cold
    # caches of a loop that has just drained, an empty `device_get` cost a CPU
    # host about 60 us.
    if any(isinstance(leaf, jax.Array) for leaf in leaves):
        leaves = jax.device_get(leaves)  # one transfer for every line
    fetched = jax.tree.unflatten(structure, leaves)
    return [line.build(values) for line, values in zip(lines, fetched, strict=True)]
