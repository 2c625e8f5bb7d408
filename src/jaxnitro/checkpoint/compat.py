"""`check_record_tree_compatible`: does a record's tree fit the model built now?

Records are keyed by key path, so two trees fit when they hold the same key paths with
the same shapes and dtypes. A refusal names the first mismatching leaves by key path
with both shapes, and how many mismatch in all, so a changed layer is found at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from ..errors import CheckpointError

_KEY_DATA_SUFFIX = "#prng_key_data"
_SHOWN = 3


def _describe(dtype: Any, shape: tuple[int, ...]) -> str:
    return f"{np.dtype(dtype)}{list(shape)}"


def tree_mismatches(
    arrays: Mapping[str, np.ndarray],
    prefix: str,
    template: Any,
    *,
    key_impls: Mapping[str, str] | None = None,
) -> list[str]:
    """Each difference between the stored `<prefix>/...` leaves and `template`'s.

    Differences are in the template's leaf order, then extra stored leaves sorted.
    """
    impls = key_impls or {}
    problems = []
    expected = set()
    for path, leaf in jax.tree_util.tree_flatten_with_path(template)[0]:
        keypath = jax.tree_util.keystr(path)
        name = f"{prefix}/{keypath}"
        stored_name = name + _KEY_DATA_SUFFIX if name in impls else name
        expected.add(stored_name)
        want_shape = tuple(np.shape(leaf))
        if stored_name not in arrays:
            problems.append(
                f"{keypath} is missing from the record (this model has "
                f"{_describe(_dtype_of(leaf), want_shape)})"
            )
            continue
        if name in impls:
            continue  # a PRNG key: its stored data has the impl's own shape
        stored = arrays[stored_name]
        want_dtype = _dtype_of(leaf)
        if tuple(stored.shape) != want_shape or stored.dtype != want_dtype:
            problems.append(
                f"{keypath} is {_describe(stored.dtype, stored.shape)} in the record "
                f"but {_describe(want_dtype, want_shape)} in this model"
            )
    for key in sorted(k for k in arrays if k.startswith(prefix + "/")):
        if key not in expected:
            stored = arrays[key]
            keypath = key[len(prefix) + 1 :].removesuffix(_KEY_DATA_SUFFIX)
            problems.append(
                f"{keypath} ({_describe(stored.dtype, stored.shape)}) is in the "
                f"record but not in this model"
            )
    return problems


def _dtype_of(leaf: Any) -> np.dtype:
    dtype = getattr(leaf, "dtype", None)
    return np.dtype(dtype if dtype is not None else np.asarray(leaf).dtype)


def check_record_tree_compatible(
    arrays: Mapping[str, np.ndarray],
    prefix: str,
    template: Any,
    *,
    what: str,
    path: str,
    key_impls: Mapping[str, str] | None = None,
) -> None:
    """Refuse a record whose `prefix` tree does not fit `template`, leaf for leaf.

    Args:
        arrays: the record's flat arrays (`CheckpointRecord.arrays`).
        prefix: the stored tree, e.g. "params".
        template: the tree this run built (`build_model`'s parameters, say).
        what: how the message names the tree ("parameter", "optimizer state").
        path: the record's file, for the message.
        key_impls: the record's PRNG key implementations by stored name.
    """
    problems = tree_mismatches(arrays, prefix, template, key_impls=key_impls)
    if not problems:
        return
    shown = "; ".join(problems[:_SHOWN])
    more = (
        f" ({len(problems)} mismatching leaves in all)"
        if len(problems) > _SHOWN
        else ""
    )
    raise CheckpointError(
        f"{path}: its {what} tree does not fit the one this experiment builds: "
        f"{shown}{more}. The record was written for a different model or optimizer; "
        f"build the configuration it was trained with, or start from fresh weights."
    )
