"""The values derive produced, in the forms a record can hold them exactly.

`weights=` does not run derive, so a loaded experiment takes derive's values from the
record. Device values are stored arrays already. A derived GraphConst value is stored
in the header under `derived_graphconst` when JSON reads it back as the same value of
the same type (tuples as lists; not an enum, a set or another object, whose text
would come back as a string). A derived Host value beyond the scalars of the logged
config is stored as a tensor under `host/` (a numeric array: class frequencies, a
lookup table) or in the header under `derived_host` (a JSON value: a list of class
names). Anything else is left out, and a `weights=` load warns naming it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import jax
import numpy as np

from ..experiment.traits import graphconst_fields, host_fields
from ..experiment.view import isequal

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
        elif _reads_back(value, value):
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


def _reads_back(value: Any, encoded: Any, decode: Any = lambda v: v) -> bool:
    """Whether `encoded`, written to the JSON header and read back through `decode`,
    is `value` again, of the same types (NaN and infinity pass: Python's json reads
    its own). A tuple stored as itself would come back a list, an int dict key a
    string, an enum's text a string: such values are not stored."""
    try:
        text = json.dumps(encoded)
    except (TypeError, ValueError):
        return False
    return _same(decode(json.loads(text)), value)


def derived_graphconst_record(e: Any, names: Iterable[str]) -> dict[str, Any]:
    """The derived GraphConst fields of `e` among `names` that JSON keeps exactly.

    >>> import jaxnitro as nx
    >>> class E(nx.Experiment):
    ...     shape: nx.GraphConst[tuple] = ()
    ...     kind: nx.GraphConst[frozenset] = frozenset()
    >>> derived_graphconst_record(E(shape=(2, (3, 4)), kind=frozenset({1})),
    ...                           ["shape", "kind"])
    {'shape': [2, [3, 4]]}
    """
    graphconst = set(graphconst_fields(type(e)))
    stored: dict[str, Any] = {}
    for name in names:
        if name not in graphconst:
            continue
        value = getattr(e, name)
        encoded = _lists(value)
        if _reads_back(value, encoded, graphconst_from_json):
            stored[name] = encoded
    return stored


def graphconst_from_json(value: Any) -> Any:
    """A GraphConst value as `derived_graphconst_record` stored it: lists as tuples."""
    if isinstance(value, list):
        return tuple(graphconst_from_json(v) for v in value)
    return value


def _lists(value: Any) -> Any:
    if isinstance(value, tuple) and not hasattr(type(value), "_fields"):
        return [_lists(v) for v in value]
    return value


def _same(a: Any, b: Any) -> bool:
    """Equal and of the same types throughout (a str enum equals its text, and a
    bool equals 1, but neither reads back as what it was)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return isequal(a, b)
