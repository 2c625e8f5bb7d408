"""The Host values derive produced, in the forms a record can hold them.

A record keeps Device arrays and GraphConst values, and scalar Host values in its
logged config. derive may also produce a Host array (class frequencies, a lookup
table) or a JSON value (a list of class names); `weights=` does not run derive, so a
loaded experiment needs them from the record. Numeric arrays are stored as tensors
under `host/`, values that survive a JSON round trip unchanged in the header under
`derived_host`. Anything else is left out, and a `weights=` load warns naming it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import jax
import numpy as np

from ..traits import host_fields

HOST_PREFIX = "host"
"""The record's tree of derived Host arrays, keyed by field name."""


def derived_host_record(
    e: Any, names: Iterable[str]
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The derived Host fields of `e` among `names`: (numeric arrays, JSON values).

    >>> import jaxnitro as nx
    >>> class E(nx.Experiment):
    ...     counts: np.ndarray = None
    ...     classes: list = None
    >>> derived_host_record(E(counts=np.arange(3), classes=["a", "b"]),
    ...                     ["counts", "classes"])
    ({'counts': array([0, 1, 2])}, {'classes': ['a', 'b']})
    """
    host = set(host_fields(type(e)))
    arrays: dict[str, np.ndarray] = {}
    values: dict[str, Any] = {}
    for name in names:
        if name not in host:
            continue
        value = getattr(e, name)
        if _numeric_array(value):
            arrays[name] = np.asarray(value)
        elif _survives_json(value):
            values[name] = value
    return arrays, values


def _numeric_array(value: Any) -> bool:
    if not isinstance(value, np.ndarray | jax.Array):
        return False
    kind = np.dtype(value.dtype).kind if isinstance(value, np.ndarray) else None
    if kind is None:  # a JAX array: its dtype may be a PRNG key or bfloat16
        return bool(
            jax.dtypes.issubdtype(value.dtype, np.number)
            or jax.dtypes.issubdtype(value.dtype, np.bool_)
        )
    return kind in "biuf"


def _survives_json(value: Any) -> bool:
    # A tuple would come back a list and an int dict key a string: both compare
    # unequal, so only values read back exactly as they were are stored.
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return bool(json.loads(text) == value)
