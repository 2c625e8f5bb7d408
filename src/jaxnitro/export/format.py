"""The StableHLO bundle's layout: file names, the format version, checksums, errors.

A bundle is a folder:

- `manifest.json`: the wire contract, the format and its version, the programs,
  the weight keys, the platforms, and a sha256 of every other file;
- `program_b<N>.jaxexport`: one serialized `jax.export` program per exported batch
  size N;
- `program_dynamic.jaxexport`: the program with a symbolic batch dimension;
- `weights.safetensors`: the weights and model state, by key path;
- `provenance.json`: where the weights and the code came from;
- `git.diff`: the working tree's patch against its commit, when it was dirty;
- `postprocess.py`: `export_postprocess`'s source, when declared.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from ..errors import NitroError

FORMAT = "jaxnitro-stablehlo"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
WEIGHTS = "weights.safetensors"
PROVENANCE = "provenance.json"
GIT_DIFF = "git.diff"
POSTPROCESS = "postprocess.py"
DYNAMIC = "dynamic"


def program_file(batch: int | str) -> str:
    """The file of the program for batch size `batch` (or "dynamic")."""
    return f"program_{batch if batch == DYNAMIC else f'b{batch}'}.jaxexport"


class BundleError(NitroError):
    """A bundle cannot be loaded; a subclass says why.

    Attributes:
        file: the bundle file at fault (a path), or None.
        field: the manifest field at fault (`inputs[0].dtype`), or None.
    """

    def __init__(
        self, message: str, *, file: str | None = None, field: str | None = None
    ) -> None:
        super().__init__(message)
        self.file = file
        self.field = field


class BundleVersionError(BundleError):
    """The bundle's format is unknown or newer than this jaxnitro reads."""


class BundleFileMissingError(BundleError):
    """A file the manifest lists (or the manifest itself) is missing."""


class BundleChecksumError(BundleError):
    """A file's sha256 differs from the manifest's: it changed after the export."""


class BundleManifestError(BundleError):
    """The manifest is malformed: too large or deep, not JSON, a key missing,
    unknown or of the wrong type, or a file it needs not checksummed."""


class BundlePathError(BundleError):
    """A path in the manifest leads outside the bundle's folder (`..`, an absolute
    path, a symbolic link out of the folder)."""


class BundleProgramError(BundleError):
    """A program or the weights file does not decode, or disagrees with the
    manifest's wire contract or weight keys."""


class BundlePlatformError(BundleError):
    """The programs were lowered for no platform this process has devices of."""


def sha256(path: str | os.PathLike[str]) -> str:
    """The sha256 of a file's bytes, as hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_json(path: str | os.PathLike[str], value: Any) -> None:
    """Write `value` as indented JSON and fsync it."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2, sort_keys=False, default=_json_default)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())


def _json_default(value: Any) -> Any:
    """Provenance may hold NumPy scalars or tuples; anything else is shown by repr."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return repr(value)
