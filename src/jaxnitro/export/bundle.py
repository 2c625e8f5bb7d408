"""`StableHLOBundle`: the export backend that writes a StableHLO bundle.

The layout is in `format.py`. Each program is a `jax.export` serialization of
`program(params, state, *wire)`, lowered for every platform the backend names, so a
bundle made on a CPU machine runs on a GPU.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax import export

from ..errors import ConfigError, HookError
from ..extras import require
from .backend import ExportRequest
from .format import (
    DYNAMIC,
    FORMAT,
    FORMAT_VERSION,
    GIT_DIFF,
    MANIFEST,
    POSTPROCESS,
    PROVENANCE,
    WEIGHTS,
    program_file,
    sha256,
    write_json,
)
from .program import ExportProgram

PLATFORMS = ("cpu", "cuda")
KNOWN_PLATFORMS = ("cpu", "cuda", "rocm", "tpu")


def checked_platforms(backend: str, platforms: Sequence[str]) -> tuple[str, ...]:
    """`platforms` as a tuple, refused when empty or naming an unknown platform."""
    platforms = tuple(platforms)
    unknown = [p for p in platforms if p not in KNOWN_PLATFORMS]
    if not platforms or unknown:
        raise ConfigError(
            f"{backend}(platforms={platforms!r}): each platform is one of "
            f"{', '.join(KNOWN_PLATFORMS)}, and at least one is needed."
        )
    return platforms


SYMBOLIC_FAILED = (
    "StableHLOBundle: the program does not trace with a symbolic batch dimension "
    "({error}). The bundle ships one program that takes any batch size, so forward "
    "and export_preprocess must not depend on the batch size's value (use -1 in "
    "reshapes, x.shape[0] rather than a constant)."
)


class StableHLOBundle:
    """The StableHLO bundle format (the spec's ReactantServerBundle).

    Args:
        platforms: the platforms every program is lowered for; ("cpu", "cuda") by
            default, so a bundle made on a CPU machine serves on a GPU.

    Raises:
        ConfigError: an empty or unknown platform list.

    Examples:
        >>> StableHLOBundle().platforms
        ('cpu', 'cuda')
    """

    def __init__(self, *, platforms: Sequence[str] = PLATFORMS) -> None:
        self.platforms = checked_platforms("StableHLOBundle", platforms)

    def __repr__(self) -> str:
        return f"StableHLOBundle(platforms={self.platforms!r})"

    def write_export(
        self,
        program: ExportProgram,
        params: Any,
        state: Any,
        example_inputs: tuple[Any, ...],
        request: ExportRequest,
    ) -> str:
        """Write the bundle's files into `request.dir` and return it."""
        require("flatbuffers", extra="export", feature="StableHLOBundle")
        del example_inputs  # shapes come from the contract, at each batch size
        out = request.dir
        weights = {"params": params, "state": state}
        keys = _write_weights(os.path.join(out, WEIGHTS), weights)
        fn = jax.jit(lambda params, state, *wire: program(params, state, *wire))
        abstract = jax.tree.map(
            lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), weights
        )
        programs: dict[str, str] = {}
        for n in request.batch_sizes:
            programs[str(n)] = self._write_program(out, fn, abstract, request, n)
        (b,) = export.symbolic_shape("b")
        try:
            programs[DYNAMIC] = self._write_program(out, fn, abstract, request, b)
        except Exception as error:  # the model's own tracing error, explained
            raise HookError(SYMBOLIC_FAILED.format(error=error)) from error
        provenance = dict(request.provenance)
        diff = provenance.pop("git_diff", None)
        if diff is not None:
            with open(os.path.join(out, GIT_DIFF), "w", encoding="utf-8") as f:
                f.write(diff)
            provenance["git_diff_file"] = GIT_DIFF
        write_json(os.path.join(out, PROVENANCE), provenance)
        if request.contract.postprocess is not None:
            with open(os.path.join(out, POSTPROCESS), "w", encoding="utf-8") as f:
                f.write(request.contract.postprocess)
        files = sorted(f for f in os.listdir(out) if f != MANIFEST)
        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "name": request.name,
            **request.contract.as_json(),
            "batch_axis": 0,
            "batch_sizes": list(request.batch_sizes),
            "programs": programs,
            "platforms": list(self.platforms),
            "weights": {"file": WEIGHTS, "keys": keys},
            "jax_version": jax.__version__,
            "files": {f: sha256(os.path.join(out, f)) for f in files},
        }
        write_json(os.path.join(out, MANIFEST), manifest)
        return out

    def _write_program(
        self, out: str, fn: Any, abstract: Any, request: ExportRequest, n: Any
    ) -> str:
        wire = [
            jax.ShapeDtypeStruct((n, *spec.shape[1:]), spec.dtype)  # type: ignore[index]
            for spec in request.contract.inputs
        ]
        exported = export.export(fn, platforms=self.platforms)(
            abstract["params"], abstract["state"], *wire
        )
        name = program_file(DYNAMIC if not isinstance(n, int) else n)
        with open(os.path.join(out, name), "wb") as f:
            f.write(exported.serialize())
        return name


def _write_weights(path: str, weights: Any) -> list[str]:
    """Save the weight leaves by key path; return the keys in flatten order."""
    from safetensors.numpy import save_file

    leaves, _ = jax.tree_util.tree_flatten_with_path(weights)
    tensors = {}
    for key_path, leaf in leaves:
        tensors[jax.tree_util.keystr(key_path)] = np.require(
            np.asarray(leaf), requirements="C"
        )
    save_file(tensors, path, metadata={"format": FORMAT})
    return list(tensors)
