"""What the training state occupies on each device: the bytes of the shards each
device holds, so a replicated and an fsdp layout can be compared."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np


def device_bytes(tree: Any) -> dict[str, int]:
    """Bytes of `tree` per device (`str(device)`), summed over the shards each
    device holds; a host (NumPy) leaf counts nowhere."""
    found: dict[str, int] = {}
    for leaf in jax.tree_util.tree_leaves(tree):
        if not isinstance(leaf, jax.Array):
            continue
        for shard in leaf.addressable_shards:
            size = int(np.prod(shard.data.shape, dtype=np.int64))
            name = str(shard.device)
            found[name] = found.get(name, 0) + size * leaf.dtype.itemsize
    return found


def memory_report(parts: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    """Per device, the bytes of each of `parts` (name -> tree) and their total;
    a device holding nothing of a part shows 0 for it.

    Examples:
        >>> import jax.numpy as jnp
        >>> report = memory_report({"params": {"w": jnp.zeros((4, 4))}})
        >>> next(iter(report.values()))
        {'params': 64, 'total': 64}
    """
    report: dict[str, dict[str, int]] = {}
    for name, tree in parts.items():
        for device, size in device_bytes(tree).items():
            row = report.setdefault(device, dict.fromkeys(parts, 0))
            row[name] += size
    for row in report.values():
        row["total"] = sum(row.values())
    return report
