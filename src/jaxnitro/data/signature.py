"""What a compiled program expects of a batch: each field's shape and dtype.

A training program is compiled for the first batch's signature. A later batch of
another dtype or trailing shape makes the executable raise a bare `TypeError` (whose
hint about x64 modes misleads); `changed_field` explains it instead. It is called
only once that call has failed, so the common path pays nothing for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

Signature = dict[str, tuple[tuple[int, ...], str]]
"""Field name -> (shape, canonical dtype name)."""


def batch_signature(batch: Mapping[str, Any]) -> Signature:
    """Each field's shape and dtype as the device sees it (float64 is float32
    unless x64 is on, as the executable converts it)."""
    return {name: _field_signature(value) for name, value in batch.items()}


def _field_signature(value: Any) -> tuple[tuple[int, ...], str]:
    dtype = getattr(value, "dtype", None)
    if dtype is None:
        dtype = np.asarray(value).dtype
    canonical = jax.dtypes.canonicalize_dtype(dtype)
    return tuple(np.shape(value)), str(np.dtype(canonical))


def _shown(signature: tuple[tuple[int, ...], str]) -> str:
    shape, dtype = signature
    return f"{dtype}{list(shape)}"


def changed_field(
    expected: Signature, batch: Mapping[str, Any], split: str, index: int, epoch: int
) -> str | None:
    """The refusal naming the first field of `batch` whose shape or dtype differs
    from `expected`, or None when the batch matches it (the failure lies elsewhere).
    """
    seen = batch_signature(batch)
    for name in [*expected, *(k for k in seen if k not in expected)]:
        want, got = expected.get(name), seen.get(name)
        if want == got:
            continue
        if want is None or got is None:
            fields = f"fields {sorted(seen)}; the first batch's {sorted(expected)}"
            return (
                f"Batch {index} of split `{split}` (epoch {epoch}) has {fields}. "
                f"Every batch of a split must carry the same fields."
            )
        what = "dtype" if want[0] == got[0] else "shape"
        return (
            f"Batch {index} of split `{split}` (epoch {epoch}) changes the {what} of "
            f"field `{name}`: expected {_shown(want)} as in the first batch, received "
            f"{_shown(got)}. The training program is compiled for one shape and "
            f"dtype per field; make the source yield every batch alike (cast it, or "
            f"pad or crop it to the same trailing shape)."
        )
    return None
