"""`export_view`: the experiment as an exported trace sees it.

In training a Device field is a traced input. An exported program is called with the
wire inputs and the weights only, so every value a trace reaches must be baked into
the graph: the view copies each Device field to the host, where a trace reads it as
a constant at its current value.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from ..errors import ConfigError
from ..experiment.traits import device_fields
from ..experiment.view import compile_view, replace_fields

DEVICE_RESIDENT = (
    "{what} holds a device-resident array at {path} ({summary}). An exported program "
    "is called with the wire inputs and the weights only, so a device array a trace "
    "reaches would become an argument the bundle cannot supply. Copy it to the host "
    "(`np.asarray(jax.device_get(x))`) before the export, or keep it out of traced "
    "code."
)


def export_view(e: Any) -> Any:
    """`compile_view(e)` with every Device field copied to the host.

    A Device field `forward` reads is baked into the exported graph at its current
    value (`set_device` before exporting changes it); one it does not read is
    unused.

    Args:
        e: the experiment, as `nitro.experiment` holds it (Device fields on device).

    Returns:
        A copy of the experiment type: Host fields `StrippedHost`, Device fields
        NumPy arrays (0-d for a scalar field), GraphConst fields unchanged.

    Examples:
        >>> import jax.numpy as jnp
        >>> from jaxnitro import Experiment, Device
        >>> class E(Experiment):
        ...     scale: Device[float] = 1.0
        >>> type(export_view(E(scale=jnp.float32(2.0))).scale).__name__
        'ndarray'
    """
    host = {
        name: np.asarray(jax.device_get(getattr(e, name)))
        for name in device_fields(type(e))
    }
    return replace_fields(compile_view(e), **host)


def check_host_resident(what: str, tree: Any) -> None:
    """Raise when `tree` holds a `jax.Array` leaf, naming its key path.

    Raises:
        ConfigError: a leaf of `tree` is a `jax.Array`.
    """
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    for path, leaf in leaves:
        if isinstance(leaf, jax.Array):
            raise ConfigError(
                DEVICE_RESIDENT.format(
                    what=what,
                    path=jax.tree_util.keystr(path) or "its root",
                    summary=f"{leaf.dtype}{list(leaf.shape)}",
                )
            )
