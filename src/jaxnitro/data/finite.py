"""Whether a batch's inputs hold NaN or infinite values.

Read only after the training loss has diverged, to tell bad data from an unstable
model, so the hot loop never pays for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np


def nonfinite_fields(batch: Mapping[str, Any]) -> dict[str, tuple[int, int, int]]:
    """The floating fields of `batch` holding NaN or inf: name -> (NaN count, inf
    count, size). Fields of other kinds (integers, text) cannot hold either."""
    found: dict[str, tuple[int, int, int]] = {}
    for name, value in batch.items():
        try:
            array = np.asarray(value)
        except Exception:  # a field that is no array says nothing about this
            continue
        # jnp.issubdtype also knows bfloat16 and the other ml_dtypes floats.
        if array.dtype.kind not in "fc":
            if not jnp.issubdtype(array.dtype, jnp.floating):
                continue
            array = array.astype(np.float32)
        nans = int(np.isnan(array).sum())
        infs = int(np.isinf(array).sum())
        if nans or infs:
            found[name] = (nans, infs, int(array.size))
    return found


def describe_nonfinite(found: Mapping[str, tuple[int, int, int]]) -> str:
    """`nonfinite_fields`'s result in words: "`x` holds 3 NaN and 0 inf of 128
    values"."""
    return "; ".join(
        f"`{name}` holds {nans} NaN and {infs} inf of {size} values"
        for name, (nans, infs, size) in found.items()
    )
