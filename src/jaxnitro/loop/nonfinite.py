"""Non-finite forward outputs of an eval pass: counted where they are, read once.

A validation pass whose outputs hold NaN or infinite values can still score a
finite metric: accuracy is an argmax, and NaN logits have one. `OutputTally` counts
the NaN and infinite values of each chunk's real rows (the padding already sliced
off) among the floating (and complex) output leaves: device outputs, sharded or
not, by a small jitted reduction dispatched beside the forward, whose per-chunk
counts stay on the device until the pass ends and are then read back once, with
the metrics; host outputs (across processes, where every process holds the whole
gathered chunk, so every process counts the same) with NumPy. A count above zero
adds `NONFINITE_OUTPUTS` to the pass's metrics and warns; `watch.is_unscored` then
leaves the epoch unscored.
"""

from __future__ import annotations

import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import NitroWarning, user_stacklevel
from ..watch import NONFINITE_OUTPUTS


def _counted(leaf: Any) -> bool:
    """Whether a leaf can hold NaN or inf: a floating or complex array."""
    dtype = getattr(leaf, "dtype", None)
    # jnp.issubdtype also knows bfloat16 and the other ml_dtypes floats.
    return dtype is not None and bool(jnp.issubdtype(dtype, jnp.inexact))


@jax.jit
def _count_device(leaves: list[jax.Array]) -> jax.Array:
    """Each leaf's count of non-finite values, as one uint32 vector (a leaf of a
    chunk holds fewer than 2**32 values; the host sums them as Python ints)."""
    return jnp.stack([jnp.sum(~jnp.isfinite(x), dtype=jnp.uint32) for x in leaves])


def _count_host(leaf: Any) -> int:
    array = np.asarray(leaf)
    if array.dtype.kind not in "fc":
        array = array.astype(np.float32)
    return int(np.count_nonzero(~np.isfinite(array)))


class OutputTally:
    """The non-finite output values of one eval pass, chunk by chunk."""

    def __init__(self) -> None:
        self._device: list[jax.Array] = []  # per chunk, unread until `total`
        self._host = 0  # what has been counted on, or read back to, the host

    def add(self, outputs: Any) -> None:
        """Count one chunk's (sliced) outputs; a device count is only dispatched."""
        leaves = [leaf for leaf in jax.tree_util.tree_leaves(outputs) if _counted(leaf)]
        on_device = [leaf for leaf in leaves if isinstance(leaf, jax.Array)]
        if on_device:
            self._device.append(_count_device(on_device))
        for leaf in leaves:
            if not isinstance(leaf, jax.Array):
                self._host += _count_host(leaf)

    def total(self) -> int:
        """The pass's count: the device counts read back at once, plus the host's."""
        counts = jax.device_get(self._device)
        self._device = []
        self._host += sum(int(np.sum(c, dtype=np.int64)) for c in counts)
        return self._host


def report_nonfinite_outputs(
    split: str, result: dict[str, Any], count: int, epoch: int | None
) -> None:
    """With a count above zero, add it to `result` under `NONFINITE_OUTPUTS` and
    warn once for the pass: its metrics stand as computed, the epoch is unscored."""
    if count <= 0:
        return
    result[NONFINITE_OUTPUTS] = count
    when = f" at epoch {epoch}" if epoch is not None else ""
    warnings.warn(
        f"Split `{split}` produced {count} non-finite output values{when} (NaN or "
        f"infinite in forward's outputs); its metrics are reported as computed, "
        f"with `{NONFINITE_OUTPUTS}` = {count}, but the checkpointer keeps this "
        f"epoch's record unscored (a Last selector may keep it; Best never picks "
        f"it), and early stopping and Plateau count it as no improvement. Check the "
        f"model for a diverged output.",
        NitroWarning,
        stacklevel=user_stacklevel(),
    )
