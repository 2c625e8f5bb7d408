"""Host batches to the device: one donated identity program per placement.

`jax.device_put` walks every array through Python, about 90 us per array on a 2-core
CPU host, which is a tenth of a tutorial-sized step per field. A jitted identity
takes its NumPy arguments through the C++ dispatch path instead, and with the
argument donated it returns the transferred buffers themselves, with no second copy.
Measured on 2 cores for a tutorial batch (float32[100, 784] and float32[100, 10]):
70-85 us against 200-340 us for `jax.device_put`, and no slower for a 12 MB batch.

The copy is started, never waited for here: being a program, it runs on the device
in order behind the work already queued there, so a wait for it lasted until the
device drained (on 2 CPU cores 459 ms while a 475 ms program ran, 0.1 ms not
waited for; on the TPU it held a prefetch thread's next block back every block,
2026-12-06). A program that reads the arrays is queued after their copy.

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


@functools.lru_cache(maxsize=32)
def _padding(sharding: Any, rows: int) -> Any:
    """The transfer of a short block: each array's leading axis filled with zeros
    up to `rows` on the device (rows no program reads)."""

    def padded(batch: Any) -> Any:
        return {
            k: jax.numpy.pad(v, [(0, rows - v.shape[0])] + [(0, 0)] * (v.ndim - 1))
            for k, v in batch.items()
        }

    if sharding is None:
        return jax.jit(padded)
    return jax.jit(padded, in_shardings=sharding, out_shardings=sharding)


def _placement(sharding: Any) -> Any:
    if isinstance(sharding, jax.Device):
        return jax.sharding.SingleDeviceSharding(sharding)
    return sharding


def transfer(
    arrays: Mapping[str, Any],
    sharding: Any = None,
    *,
    rows: int | None = None,
) -> dict[str, jax.Array]:
    """`arrays` (field -> array, batch first) on the device, their copy under way
    (a program that reads them waits for it on the device).

    Host arrays go through the identity program; an array already on the device is
    placed with `jax.device_put` (the same object when it is already there), never
    donated. `sharding` is a `jax.sharding.Sharding`, a `jax.Device`, or None for
    the default device. A sharding over several processes' devices takes each
    process's `arrays` as its rows of the global batch (B_local, ...), and returns
    the global arrays (B_local * processes, ...).

    With `rows`, host arrays with fewer leading rows (a block cut short, stacked
    `(steps, ...)`) arrive padded with zeros to `rows`: the padding is made on the
    device, so the copy carries only the rows given.

    >>> short = transfer({"x": np.ones((2, 3), np.float32)}, rows=4)
    >>> short["x"].shape, float(short["x"].sum())
    ((4, 3), 6.0)
    """
    placement = _placement(sharding)
    if rows is not None:
        short = any(
            np.shape(v)[0] < rows
            for v in arrays.values()
            if not isinstance(v, jax.Array)
        )
        if not short:
            rows = None
    if placement is not None and not placement.is_fully_addressable:
        if rows is not None:  # each process's rows are placed as they are
            arrays = {k: _host_padded(v, rows) for k, v in arrays.items()}
        return _assemble(arrays, placement)
    host = {k: np.asarray(v) for k, v in arrays.items() if not isinstance(v, jax.Array)}
    placed = {
        k: jax.device_put(v, placement)
        for k, v in arrays.items()
        if isinstance(v, jax.Array)
    }
    if host:
        program = _identity(placement) if rows is None else _padding(placement, rows)
        placed.update(program(host))
    return {k: placed[k] for k in arrays}


def _host_padded(value: Any, rows: int) -> Any:
    """A host array's leading axis filled with zeros up to `rows`."""
    if isinstance(value, jax.Array) or value.shape[0] >= rows:
        return value
    value = np.asarray(value)
    return np.pad(value, [(0, rows - value.shape[0])] + [(0, 0)] * (value.ndim - 1))


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
