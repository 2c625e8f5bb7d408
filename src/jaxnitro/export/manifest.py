"""The bundle's manifest, read under bounds and checked against the format's schema.

`read_manifest` is the first thing `load_bundle` does, and nothing else in a bundle is
opened before it returns. It refuses, each with a `BundleError` subclass naming the
file and the field:

- a manifest over `MAX_MANIFEST_BYTES` or nested deeper than `MAX_MANIFEST_DEPTH`
  (checked before parsing), one that is not UTF-8 JSON, or one with a key twice;
- a key the format does not define, a key missing, a value of the wrong type or
  outside its range (a dtype NumPy does not know, a batch size of 0, a program for a
  batch size that was not exported, a sha256 that is not 64 hex digits);
- a path that leaves the bundle's folder (absolute, `..`, a symbolic link pointing
  out), named by its field (`BundlePathError`);
- a file the bundle needs (every program, the weights, the provenance, the
  postprocess when declared) missing from `files`: an empty `files` does not turn
  the checksums off.

The manifest is returned as `Manifest`: the JSON as read (what `nitro serve` shows)
and the typed parts the loader and the server use.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, NoReturn

import ml_dtypes  # noqa: F401  (registers bfloat16 and friends with NumPy)
import numpy as np

from ..json_bounds import JSONRefused, loads_bounded
from .bundle import KNOWN_PLATFORMS
from .format import (
    DYNAMIC,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    PROVENANCE,
    BundleFileMissingError,
    BundleManifestError,
    BundlePathError,
    BundleVersionError,
)
from .spec import NONFINITE

MAX_MANIFEST_BYTES = 32 * 2**20
"""The largest manifest `load_bundle` parses (a manifest lists one key per weight
tensor: 32 MiB holds hundreds of thousands)."""

MAX_MANIFEST_DEPTH = 16
"""The deepest JSON nesting `load_bundle` parses (a manifest nests 4 levels)."""

_SHA256 = re.compile(r"[0-9a-f]{64}")
TOP = "the top level"
_DAMAGED = "The manifest is damaged or was edited by hand: export the bundle again."


@dataclass(frozen=True)
class WireSpec:
    """One tensor of a loaded bundle's wire contract.

    Attributes:
        name: the tensor's name.
        dtype: its dtype.
        shape: its shape, batch axis first; the batch size is a placeholder.
        nonfinite: "refuse" (NaN and infinite values are refused before the
            program runs) or "allow"; outputs always say "refuse", unused.
    """

    name: str
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    nonfinite: str = "refuse"

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """The shape of one sample: `shape` without the batch axis."""
        return self.shape[1:]

    def describe(self) -> str:
        """The spec as messages show it, e.g. `float32[batch, 8]`."""
        return f"{self.dtype.name}[{', '.join(['batch', *map(str, self.shape[1:])])}]"


@dataclass(frozen=True)
class Manifest:
    """A checked manifest.

    Attributes:
        data: the manifest as read (JSON values).
        file: the manifest's path.
        name: the bundle's name.
        inputs / outputs: the wire contract, in wire and shipping order.
        batch_sizes: the exported batch sizes.
        programs: the program file of each batch size (str(n), and "dynamic").
        weights_file: the weights file.
        weight_keys: the weight tensors' keys, in the programs' argument order.
        files: the sha256 of every file the manifest lists, by name; it covers
            every file listed above.
    """

    data: dict[str, Any]
    file: str
    name: str
    inputs: tuple[WireSpec, ...]
    outputs: tuple[WireSpec, ...]
    batch_sizes: tuple[int, ...]
    programs: dict[str, str]
    weights_file: str
    weight_keys: tuple[str, ...]
    files: dict[str, str]


def read_manifest(root: str) -> Manifest:
    """Read and check the manifest of the bundle in folder `root`.

    Args:
        root: the bundle's folder, absolute with symbolic links resolved.

    Returns:
        Manifest: the checked manifest.

    Raises:
        BundleFileMissingError: there is no manifest.
        BundleVersionError: another format, or a newer version.
        BundleManifestError: the manifest breaks a limit or the schema.
        BundlePathError: a path in it leaves the bundle's folder.
    """
    file = os.path.join(root, MANIFEST)
    if not os.path.lexists(file):
        raise BundleFileMissingError(
            f"load_bundle: {file} does not exist; {root} is not a bundle "
            "(export_model writes one with its manifest).",
            file=file,
        )
    _inside(root, file, MANIFEST, "the manifest")
    if not os.path.isfile(file):
        raise BundleManifestError(
            f"load_bundle: {file} is not a regular file; {root} is not a bundle.",
            file=file,
        )
    data = _parse(file)
    check = _Schema(file)
    top = check.object(data, TOP)
    _check_version(file, top)
    check.keys(top, TOP, required=_TOP_KEYS)
    name = check.string(top["name"], "name")
    if "/" in name or name in (".", ".."):
        check.fail("name", f"is {name!r}; a bundle's name is a folder name.")
    inputs = check.specs(top["inputs"], "inputs", wire=True, input_side=True)
    outputs = check.specs(top["outputs"], "outputs", wire=True, input_side=False)
    for group in ("client_inputs", "client_outputs"):
        if top[group] is not None:
            check.specs(top[group], group, wire=False, input_side=False)
    if top["batch_axis"] != 0 or isinstance(top["batch_axis"], bool):
        check.fail("batch_axis", f"is {top['batch_axis']!r}; the format says 0.")
    sizes = check.batch_sizes(top["batch_sizes"])
    programs = check.programs(top["programs"], sizes)
    platforms = check.array(top["platforms"], "platforms")
    if not platforms:
        check.fail("platforms", "is empty; a bundle names at least one.")
    for i, platform in enumerate(platforms):
        if platform not in KNOWN_PLATFORMS:
            check.fail(
                f"platforms[{i}]",
                f"is {platform!r}, not one of {', '.join(KNOWN_PLATFORMS)}.",
            )
    weights = check.object(top["weights"], "weights")
    check.keys(weights, "weights", required=("file", "keys"))
    weights_file = check.string(weights["file"], "weights.file")
    keys = check.array(weights["keys"], "weights.keys")
    for i, key in enumerate(keys):
        check.string(key, f"weights.keys[{i}]")
    if len(set(keys)) != len(keys):
        check.fail("weights.keys", "names a weight tensor twice.")
    check.string(top["jax_version"], "jax_version")
    files = check.files(top["files"])
    needed = {f"programs[{batch!r}]": path for batch, path in programs.items()}
    needed["weights.file"] = weights_file
    needed["the provenance"] = PROVENANCE
    if top["postprocess"] is not None:
        needed["postprocess"] = check.string(top["postprocess"], "postprocess")
    for field, path in needed.items():
        _inside(root, os.path.join(root, path), path, field)
        if path not in files:
            raise BundleManifestError(
                f"load_bundle: {file}: files has no sha256 for {path!r} ({field}); "
                "every file a bundle needs is listed there with its checksum, so an "
                f"edited 'files' cannot switch the check off. {_DAMAGED}",
                file=file,
                field="files",
            )
    for path in files:
        _inside(root, os.path.join(root, path), path, f"files[{path!r}]")
    return Manifest(
        data=top,
        file=file,
        name=name,
        inputs=inputs,
        outputs=outputs,
        batch_sizes=sizes,
        programs=programs,
        weights_file=weights_file,
        weight_keys=tuple(keys),
        files=files,
    )


_TOP_KEYS = (
    "format",
    "format_version",
    "name",
    "inputs",
    "outputs",
    "client_inputs",
    "client_outputs",
    "postprocess",
    "batch_axis",
    "batch_sizes",
    "programs",
    "platforms",
    "weights",
    "jax_version",
    "files",
)
_SPEC_KEYS = ("name", "dtype", "shape", "batch_axis", "axis_letters")


def _parse(file: str) -> Any:
    try:
        size = os.stat(file).st_size
        if size > MAX_MANIFEST_BYTES:
            raise BundleManifestError(
                f"load_bundle: {file} is {size} bytes; a manifest is at most "
                f"{MAX_MANIFEST_BYTES}. {_DAMAGED}",
                file=file,
            )
        with open(file, "rb") as f:
            data = f.read(MAX_MANIFEST_BYTES + 1)  # bounded, should it have grown
    except OSError as error:
        raise BundleManifestError(
            f"load_bundle: {file} cannot be read ({error}).", file=file
        ) from error
    try:
        return loads_bounded(
            data,
            max_bytes=MAX_MANIFEST_BYTES,
            max_depth=MAX_MANIFEST_DEPTH,
            what=file,
        )
    except JSONRefused as error:
        raise BundleManifestError(
            f"load_bundle: {error} {_DAMAGED}", file=file
        ) from error


def _check_version(file: str, top: dict[str, Any]) -> None:
    version = top.get("format_version")
    if (
        top.get("format") != FORMAT
        or not isinstance(version, int)
        or isinstance(version, bool)
    ):
        raise BundleVersionError(
            f"load_bundle: {file} declares format {top.get('format')!r} "
            f"version {version!r}; this jaxnitro reads {FORMAT!r}.",
            file=file,
            field="format",
        )
    if version > FORMAT_VERSION or version < 1:
        raise BundleVersionError(
            f"load_bundle: {os.path.dirname(file)} has format version {version}, "
            f"newer than the {FORMAT_VERSION} this jaxnitro reads. Upgrade jaxnitro "
            "to load it."
            if version > FORMAT_VERSION
            else f"load_bundle: {file}: format_version is {version}; versions "
            "start at 1.",
            file=file,
            field="format_version",
        )


def _inside(root: str, path: str, name: str, field: str) -> str:
    """`path` with symbolic links resolved, refused unless it lies inside `root`."""
    if (
        not name
        or "\x00" in name
        or os.path.isabs(name)
        or name.startswith("\\")
        or ".." in re.split(r"[/\\]", name)
    ):
        raise BundlePathError(
            f"load_bundle: {field} is {name!r}, which is not a path inside the "
            f"bundle's folder {root}; a manifest names its files relative to the "
            "folder, without '..' or a leading '/'. Refusing to read it.",
            file=os.path.join(root, MANIFEST),
            field=field,
        )
    real = os.path.realpath(path)
    if os.path.commonpath([root, real]) != root or real == root:
        leads = (
            "names the bundle's folder itself"
            if real == root
            else f"resolves to {real} through a symbolic link, outside the "
            f"bundle's folder {root}"
        )
        raise BundlePathError(
            f"load_bundle: {field} is {name!r}, which {leads}. Refusing to read "
            "it; a bundle's files are regular files inside its folder (copy a "
            "file in rather than linking it).",
            file=os.path.join(root, MANIFEST),
            field=field,
        )
    return real


class _Schema:
    """The manifest's checks, each naming the field it refuses."""

    def __init__(self, file: str) -> None:
        self.file = file

    def fail(self, field: str, message: str) -> NoReturn:
        raise BundleManifestError(
            f"load_bundle: {self.file}: {field} {message} {_DAMAGED}",
            file=self.file,
            field=field,
        )

    def typed(self, value: Any, field: str, kind: type, name: str) -> Any:
        if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
            self.fail(field, f"must be {name}, got {_kind(value)} {_brief(value)}.")
        return value

    def object(self, value: Any, field: str) -> dict[str, Any]:
        return self.typed(value, field, dict, "an object")  # type: ignore[no-any-return]

    def array(self, value: Any, field: str) -> list[Any]:
        return self.typed(value, field, list, "an array")  # type: ignore[no-any-return]

    def string(self, value: Any, field: str) -> str:
        text = self.typed(value, field, str, "a string")
        if not text:
            self.fail(field, "is empty.")
        return text  # type: ignore[no-any-return]

    def integer(self, value: Any, field: str, *, low: int) -> int:
        number = self.typed(value, field, int, "an integer")
        if number < low:
            self.fail(field, f"is {number}; it must be >= {low}.")
        return number  # type: ignore[no-any-return]

    def keys(
        self,
        value: dict[str, Any],
        field: str,
        *,
        required: tuple[str, ...],
        optional: tuple[str, ...] = (),
    ) -> None:
        prefix = "" if field == TOP else f"{field}."
        for key in required:
            if key not in value:
                self.fail(
                    f"{prefix}{key}",
                    f"is missing; format version {FORMAT_VERSION} requires it.",
                )
        for key in value:
            if key not in required and key not in optional:
                self.fail(
                    f"{prefix}{key}",
                    f"is not a key format version {FORMAT_VERSION} defines "
                    f"(it defines {', '.join((*required, *optional))}).",
                )

    def specs(
        self, value: Any, field: str, *, wire: bool, input_side: bool
    ) -> tuple[WireSpec, ...]:
        items = self.array(value, field)
        if not items:
            self.fail(field, "is empty; a bundle has at least one.")
        specs = []
        for i, item in enumerate(items):
            where = f"{field}[{i}]"
            spec = self.object(item, where)
            optional = ("nonfinite",) if input_side else ()
            self.keys(spec, where, required=_SPEC_KEYS, optional=optional)
            name = self.string(spec["name"], f"{where}.name")
            dtype = self.dtype(spec["dtype"], f"{where}.dtype")
            shape = tuple(self.array(spec["shape"], f"{where}.shape"))
            if not shape:
                self.fail(f"{where}.shape", "is empty; it starts with the batch axis.")
            for j, size in enumerate(shape):
                size = self.typed(size, f"{where}.shape[{j}]", int, "an integer")
                if size < 1 and not (size == -1 and not wire):
                    self.fail(f"{where}.shape[{j}]", f"is {size}; sizes are >= 1.")
            axis = self.integer(spec["batch_axis"], f"{where}.batch_axis", low=0)
            if wire and axis != 0:
                self.fail(f"{where}.batch_axis", f"is {axis}; wire tensors use 0.")
            letters = spec["axis_letters"]
            if letters is not None:
                self.typed(letters, f"{where}.axis_letters", str, "a string or null")
                if len(letters) != len(shape) - 1:
                    self.fail(
                        f"{where}.axis_letters",
                        f"is {letters!r}; it has one letter per non-batch axis of "
                        f"the shape {list(shape)}.",
                    )
            nonfinite = spec.get("nonfinite", "refuse")
            if nonfinite not in NONFINITE:
                self.fail(
                    f"{where}.nonfinite",
                    f"is {_brief(nonfinite)}; it is one of {list(NONFINITE)}.",
                )
            specs.append(WireSpec(name, dtype, shape, nonfinite))
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            self.fail(field, f"names a tensor twice ({names}).")
        return tuple(specs)

    def dtype(self, value: Any, field: str) -> np.dtype[Any]:
        text = self.string(value, field)
        try:
            dtype = np.dtype(text)
        except Exception:  # NumPy's parser raises TypeError, ValueError, ...
            self.fail(field, f"is {text!r}, not a NumPy dtype name such as 'float32'.")
        numeric = dtype.kind in "biufc" or dtype.type.__module__ == "ml_dtypes"
        if not numeric or dtype.name != text:
            self.fail(
                field,
                f"is {text!r}; a wire tensor has a numeric dtype, written by its "
                "name ('float32', 'uint8', 'bfloat16').",
            )
        return dtype

    def batch_sizes(self, value: Any) -> tuple[int, ...]:
        items = self.array(value, "batch_sizes")
        if not items:
            self.fail("batch_sizes", "is empty; a bundle has at least one.")
        sizes = tuple(
            self.integer(n, f"batch_sizes[{i}]", low=1) for i, n in enumerate(items)
        )
        if len(set(sizes)) != len(sizes):
            self.fail("batch_sizes", f"repeats a size: {list(sizes)}.")
        return sizes

    def programs(self, value: Any, sizes: tuple[int, ...]) -> dict[str, str]:
        programs = self.object(value, "programs")
        expected = (*map(str, sizes), DYNAMIC)
        self.keys(programs, "programs", required=expected)
        return {k: self.string(programs[k], f"programs[{k!r}]") for k in expected}

    def files(self, value: Any) -> dict[str, str]:
        files = self.object(value, "files")
        for name, digest in files.items():
            self.typed(digest, f"files[{name!r}]", str, "a sha256 hex string")
            if not _SHA256.fullmatch(digest):
                self.fail(
                    f"files[{name!r}]",
                    f"is {_brief(digest)}, not a sha256 (64 lowercase hex digits).",
                )
        return files


_KINDS: dict[type, str] = {
    dict: "an object",
    list: "an array",
    str: "a string",
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    type(None): "null",
}


def _kind(value: Any) -> str:
    return _KINDS.get(type(value), type(value).__name__)


def _brief(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
