"""`TFSavedModel`: the export backend that writes a TensorFlow SavedModel.

Each exported batch size becomes one signature, `b<N>`, whose graph is a single
`XlaCallModule` op: `jax2tf` serializes `program(params, state, *wire)` natively
(the StableHLO that `jax.export` produces, the only mode this jax has). The weights
are non-trainable `tf.Variable`s that every signature reads, saved once. The
signature's arguments are the wire inputs by name and its outputs the shipped
outputs by name; `serving_default` is the first batch size's signature.

Beside TensorFlow's own files the folder holds `assets.extra/` (a directory TF
Serving leaves alone): `manifest.json` (the wire contract and the signatures),
`provenance.json`, `git.diff` when the tree was dirty, and `postprocess.py` when
declared.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from ..extras import require
from .backend import ExportRequest
from .bundle import checked_platforms
from .format import GIT_DIFF, MANIFEST, POSTPROCESS, PROVENANCE, write_json
from .program import ExportProgram

TF_FORMAT = "jaxnitro-tf-saved-model"
TF_FORMAT_VERSION = 1
EXTRA = "assets.extra"
PLATFORMS = ("cpu",)


def signature_key(batch: int) -> str:
    """The SavedModel signature of the program for batch size `batch`."""
    return f"b{batch}"


class TFSavedModel:
    """The TensorFlow SavedModel format (optional `tf` extra: `tensorflow-cpu`).

    Load the result with `tf.saved_model.load(path)` and call
    `loaded.signatures["b8"](x=...)`, or serve it with TF Serving.

    Args:
        platforms: the platforms every signature's `XlaCallModule` is lowered for;
            ("cpu",) by default, the platform `tensorflow-cpu` runs. Add "cuda"
            for a SavedModel that a GPU build of TensorFlow serves.

    Raises:
        ConfigError: an empty or unknown platform list.

    Examples:
        >>> TFSavedModel(platforms=("cpu", "cuda")).platforms
        ('cpu', 'cuda')
    """

    def __init__(self, *, platforms: Sequence[str] = PLATFORMS) -> None:
        self.platforms = checked_platforms("TFSavedModel", platforms)

    def __repr__(self) -> str:
        return f"TFSavedModel(platforms={self.platforms!r})"

    def write_export(
        self,
        program: ExportProgram,
        params: Any,
        state: Any,
        example_inputs: tuple[Any, ...],
        request: ExportRequest,
    ) -> str:
        """Save the SavedModel into `request.dir` and return it."""
        tf = require("tensorflow", extra="tf", feature="TFSavedModel")
        from jax.experimental import jax2tf

        del example_inputs  # shapes come from the contract, at each batch size
        leaves, treedef = jax.tree_util.tree_flatten_with_path(
            {"params": params, "state": state}
        )
        keys = [jax.tree_util.keystr(path) for path, _ in leaves]
        module = tf.Module()
        module.weights = [
            tf.Variable(np.asarray(leaf), trainable=False, name=_variable_name(key))
            for key, (_, leaf) in zip(keys, leaves, strict=True)
        ]

        def jax_fn(weights: list[Any], *wire: Any) -> tuple[Any, ...]:
            tree = jax.tree_util.tree_unflatten(treedef, weights)
            return program(tree["params"], tree["state"], *wire)

        converted = jax2tf.convert(
            jax_fn, with_gradient=False, native_serialization_platforms=self.platforms
        )
        signatures: dict[str, Any] = {}
        for n in request.batch_sizes:
            signatures[signature_key(n)] = _signature(
                tf, converted, module.weights, program, request, n
            )
        signatures["serving_default"] = signatures[
            signature_key(request.batch_sizes[0])
        ]
        out = request.dir
        tf.saved_model.save(module, out, signatures=signatures)
        self._write_extra(os.path.join(out, EXTRA), request, keys, tf.__version__)
        return out

    def _write_extra(
        self, extra: str, request: ExportRequest, keys: list[str], tf_version: str
    ) -> None:
        """The manifest, provenance, diff and postprocess, in `assets.extra/`."""
        os.makedirs(extra)
        provenance = dict(request.provenance)
        diff = provenance.pop("git_diff", None)
        if diff is not None:
            with open(os.path.join(extra, GIT_DIFF), "w", encoding="utf-8") as f:
                f.write(diff)
            provenance["git_diff_file"] = f"{EXTRA}/{GIT_DIFF}"
        write_json(os.path.join(extra, PROVENANCE), provenance)
        if request.contract.postprocess is not None:
            with open(os.path.join(extra, POSTPROCESS), "w", encoding="utf-8") as f:
                f.write(request.contract.postprocess)
        manifest = {
            "format": TF_FORMAT,
            "format_version": TF_FORMAT_VERSION,
            "name": request.name,
            **request.contract.as_json(),
            "batch_axis": 0,
            "batch_sizes": list(request.batch_sizes),
            "signatures": {str(n): signature_key(n) for n in request.batch_sizes},
            "serving_default": signature_key(request.batch_sizes[0]),
            "platforms": list(self.platforms),
            "weights": {"variables": keys},
            "jax_version": jax.__version__,
            "tensorflow_version": tf_version,
        }
        write_json(os.path.join(extra, MANIFEST), manifest)


def _signature(
    tf: Any,
    converted: Any,
    weights: list[Any],
    program: ExportProgram,
    request: ExportRequest,
    n: int,
) -> Any:
    """The concrete function for batch size `n`: wire tensors by name in, the
    shipped outputs by name out."""
    specs = [
        tf.TensorSpec(
            (n, *spec.shape[1:]),  # type: ignore[index]
            tf.as_dtype(np.dtype(spec.dtype)),
            name=spec.name,
        )
        for spec in request.contract.inputs
    ]

    @tf.function(input_signature=specs, autograph=False)
    def serve(*wire: Any) -> dict[str, Any]:
        shipped = converted(weights, *wire)
        return dict(zip(program.output_names, shipped, strict=True))

    return serve.get_concrete_function()


def _variable_name(key: str) -> str:
    """A TensorFlow variable name for a weight's key path (`['params']['w']` ->
    `params.w`); TF allows letters, digits and `_.-/` only."""
    name = re.sub(r"[^A-Za-z0-9_.\-/]+", ".", key).strip("./")
    return name or "weight"
