"""Host batches to the device: one donated identity program per placement.

`jax.device_put` walks every array through Python, about 90 us per array on a 2-core
CPU host, which is a tenth of a tutorial-sized step per field. A jitted identity
takes its NumPy arguments through the C++ dispatch path instead, and with the
argument donated it returns the transferred buffers themselves, with no second copy.
Measured on 2 cores for a tutorial batch (float32[100, 784] and float32[100, 10]):
70-85 us against 200-340 us for `jax.device_put`, and no slower for a 12 MB batch.

    >>> import numpy as np
    >>> placed = transfer({"x": np.ones((2, 3), np.float32)})
    >>> type(placed["x"]).__name__, placed["x"].shape
    ('ArrayImpl', (2, 3))
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np


def _same(batch: Any) -> Any:
    return batch


@functools.lru_cache(maxsize=32)
def _identity(sharding: Any) -> Any:
    if sharding is None:
        return jax.jit(_same, donate_argnums=0)
    return jax.jit(
        _same, in_shardings=sharding, out_shardings=sharding, donate_argnums=0
    )


def _placement(sharding: Any) -> Any:
    if isinstance(sharding, jax.Device):
        return jax.sharding.SingleDeviceSharding(sharding)
    return sharding


def transfer(
    arrays: Mapping[str, Any], sharding: Any = None, *, wait: bool = True
) -> dict[str, jax.Array]:
    """`arrays` (field -> array, batch first) on the device, the copy finished
    (`wait=False`: under way; a program that reads them waits on the device).

    Host arrays go through the identity program; an array already on the device is
    placed with `jax.device_put` (the same object when it is already there), never
    donated. `sharding` is a `jax.sharding.Sharding`, a `jax.Device`, or None for
    the default device. A sharding over several processes' devices takes each
    process's `arrays` as its rows of the global batch (B_local, ...), and returns
    the global arrays (B_local * processes, ...).
    """
    placement = _placement(sharding)
    if placement is not None and not placement.is_fully_addressable:
        return _assemble(arrays, placement)
    host = {k: np.asarray(v) for k, v in arrays.items() if not isinstance(v, jax.Array)}
    placed = {
        k: jax.device_put(v, placement)
        for k, v in arrays.items()
        if isinstance(v, jax.Array)
    }
    if host:
        placed.update(_identity(placement)(host))
    if wait:
        for array in placed.values():
            array.block_until_ready()
    return {k: placed[k] for k in arrays}


def _assemble(arrays: Mapping[str, Any], sharding: Any) -> dict[str, jax.Array]:
    """In a run across processes: each process holds its own rows of the global
    batch (rank 0 the first, ...), and the global arrays are assembled from every
    process's, each process's rows on its own devices."""
    placed = {
        k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
        for k, v in arrays.items()
    }
    for array in placed.values():
        array.block_until_ready()
    return placed


def is_numeric_dtype(dtype: Any) -> bool:
    """Whether a host array of `dtype` can go to the device as a routed field.

    Booleans, integers, floats and complex numbers, the `ml_dtypes` ones (bfloat16,
    float8, int4) included; not strings, bytes, objects, datetimes or records.

    >>> is_numeric_dtype(np.dtype(np.float32)), is_numeric_dtype(np.dtype("U3"))
    (True, False)
    """
    return dtype.kind in "biufc" or bool(jax.dtypes.issubdtype(dtype, np.number))
