"""Padding a short eval batch to the compiled batch size, and slicing outputs back.

The eval program is compiled for one batch size. A short final batch is padded by
repeating its last sample (zeros could produce NaN in a forward pass and poison a
reduction), the program runs at the full size, and every output leaf is sliced back to
the real count before any hook sees it, so metrics never see a padded sample.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from ..errors import HookError


def pad_batch(batch: Mapping[str, np.ndarray], size: int) -> dict[str, np.ndarray]:
    """Each field padded along axis 0 to `size` by repeating its last sample."""
    padded = {}
    for name, value in batch.items():
        array = np.asarray(value)
        missing = size - array.shape[0]
        if missing > 0 and array.shape[0] == 0:
            # Nothing to repeat: zeros keep the width (across processes every
            # process's part must have it); such a part is refused before it runs.
            array = np.zeros((size, *array.shape[1:]), array.dtype)
        elif missing > 0:
            array = np.concatenate([array, np.repeat(array[-1:], missing, axis=0)])
        padded[name] = array
    return padded


def check_batch_first(outputs: Any, size: int) -> None:
    """Refuse an output leaf that does not carry the batch dimension first."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(outputs)[0]:
        shape = np.shape(leaf)
        if not shape or shape[0] != size:
            where = jax.tree_util.keystr(path) or "outputs"
            raise HookError(
                f"`forward` output leaf {where} has shape {tuple(shape)}, but every "
                f"output leaf must have the batch dimension ({size}) first: a short "
                f"final eval batch is padded and sliced back along axis 0. Reduce a "
                f"per-batch scalar in `loss` or `metrics` instead of returning it."
            )


def slice_outputs(outputs: Any, count: int) -> Any:
    """Every output leaf cut back to the real sample count along axis 0."""
    return jax.tree.map(lambda leaf: leaf[:count], outputs)
