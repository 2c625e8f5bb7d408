"""The checkpoint record: one `.safetensors` file per checkpoint, no pickle anywhere.

Arrays are stored flat under `<tree>/<keypath>` keys (`params/['Dense_0']['kernel']`,
`opt_state/...`, `device/<field>`); the rest of the record (step, epoch, seed, preset,
config, metrics, stop_reason, run ids, logger state, versions) is JSON in the header
under the `jaxnitro` key, so `checkpoint_info` reads it without loading a weight.
Restoring fills a template tree (what `build_model` or the optimizer builds) leaf for
leaf by key path, so no tree structure is ever deserialized from the file: a checkpoint
from an untrusted source cannot run code.

Writes go to a temporary file in the same directory, are fsynced, then renamed into
place: a crash at any instant leaves either the old file or the new one.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from ..errors import CheckpointError

FORMAT_VERSION = 1
_META_KEY = "jaxnitro"
_KEY_DATA_SUFFIX = "#prng_key_data"


def atomic_write(path: str, write: Callable[[str], None]) -> None:
    """Write `path` through a temporary file, fsynced and renamed into place."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    handle, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    os.close(handle)
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def _host_array(leaf: Any) -> tuple[np.ndarray, str | None]:
    if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(
        leaf.dtype, jax.dtypes.prng_key
    ):
        impl = str(jax.random.key_impl(leaf))
        return np.asarray(jax.random.key_data(leaf)), impl
    # A non-contiguous array would be saved wrong; np.require keeps 0-d arrays 0-d.
    return np.require(np.asarray(leaf), requirements="C"), None


def flatten_tree(
    prefix: str, tree: Any
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """A tree's leaves as host arrays keyed `<prefix>/<keypath>`, and PRNG key impls."""
    arrays: dict[str, np.ndarray] = {}
    key_impls: dict[str, str] = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        name = f"{prefix}/{jax.tree_util.keystr(path)}"
        array, impl = _host_array(leaf)
        if impl is not None:
            key_impls[name] = impl
            name += _KEY_DATA_SUFFIX
        arrays[name] = array
    return arrays, key_impls


def save_record(path: str, trees: Mapping[str, Any], meta: Mapping[str, Any]) -> None:
    """Write a record: each tree in `trees` under its prefix, `meta` in the header."""
    arrays: dict[str, np.ndarray] = {}
    key_impls: dict[str, str] = {}
    for prefix, tree in trees.items():
        tree_arrays, tree_impls = flatten_tree(prefix, tree)
        arrays.update(tree_arrays)
        key_impls.update(tree_impls)
    header = dict(meta)
    header["format_version"] = FORMAT_VERSION
    header["prng_keys"] = key_impls
    text = json.dumps(header, default=_json_default)
    atomic_write(path, lambda tmp: save_file(arrays, tmp, metadata={_META_KEY: text}))


def _json_default(value: Any) -> Any:
    if isinstance(value, np.ndarray | np.generic):
        array = np.asarray(value)
        return array.item() if array.ndim == 0 else array.tolist()
    return repr(value)


def read_meta(path: str) -> dict[str, Any]:
    """The record's header metadata, without loading any array."""
    try:
        with safe_open(path, "np") as f:
            metadata = f.metadata() or {}
    except FileNotFoundError:
        raise CheckpointError(f"No checkpoint at {path}.") from None
    except Exception as error:
        raise CheckpointError(f"{path} is not a readable checkpoint: {error}") from None
    if _META_KEY not in metadata:
        raise CheckpointError(
            f"{path} is a safetensors file but not a jaxnitro record."
        )
    meta = json.loads(metadata[_META_KEY])
    if meta.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"{path} has record format {meta.get('format_version')!r}; this jaxnitro "
            f"reads format {FORMAT_VERSION}."
        )
    return meta


class Record:
    """A loaded checkpoint: the header metadata and the stored arrays by key."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.meta = read_meta(path)
        self.arrays = load_file(path)

    def keep_only(self, prefix: str) -> None:
        """Free the host copies of every stored tree but `prefix`."""
        self.arrays = {
            k: v for k, v in self.arrays.items() if k.startswith(prefix + "/")
        }

    def has_tree(self, prefix: str) -> bool:
        """Whether the record stores any leaf under `prefix`."""
        return any(key.startswith(prefix + "/") for key in self.arrays)

    def restore(self, prefix: str, template: Any, what: str) -> Any:
        """Fill `template`'s leaves from the arrays stored under `prefix`, on device.

        Refuses a missing leaf, an extra stored leaf and a shape or dtype mismatch,
        naming the leaf by key path.
        """
        impls = self.meta.get("prng_keys", {})
        paths, treedef = jax.tree_util.tree_flatten_with_path(template)
        leaves = []
        expected = set()
        for path, leaf in paths:
            name = f"{prefix}/{jax.tree_util.keystr(path)}"
            impl = impls.get(name)
            stored_name = name + _KEY_DATA_SUFFIX if impl else name
            expected.add(stored_name)
            if stored_name not in self.arrays:
                raise CheckpointError(
                    f"{self.path} has no {what} leaf {jax.tree_util.keystr(path)}: "
                    f"the record was written for a different model or optimizer."
                )
            stored = self.arrays[stored_name]
            if impl:
                leaves.append(jax.random.wrap_key_data(jnp.asarray(stored), impl=impl))
                continue
            want_shape = np.shape(leaf)
            want_dtype = np.dtype(
                getattr(leaf, "dtype", None) or np.asarray(leaf).dtype
            )
            if stored.shape != want_shape or stored.dtype != want_dtype:
                raise CheckpointError(
                    f"{self.path}: {what} leaf {jax.tree_util.keystr(path)} is "
                    f"{stored.dtype}{list(stored.shape)} in the record but "
                    f"{want_dtype}{list(want_shape)} in this model."
                )
            leaves.append(jnp.asarray(stored))
        extra = sorted(
            k for k in self.arrays if k.startswith(prefix + "/") and k not in expected
        )
        if extra:
            raise CheckpointError(
                f"{self.path} stores {what} leaves this model does not have: "
                f"{', '.join(e[len(prefix) + 1 :] for e in extra[:5])}."
            )
        return jax.tree_util.tree_unflatten(treedef, leaves)

    def device_values(self) -> dict[str, np.ndarray]:
        """The Device field values stored in the record, by field name."""
        found = {}
        for key, value in self.arrays.items():
            if key.startswith("device/['") and key.endswith("']"):
                found[key[len("device/['") : -2]] = value
        return found
