"""`load_bundle`: a StableHLO bundle back as a callable, checked before it runs.

Loading reads the manifest under bounds and checks it against the format's schema
(`manifest.py`: every key and type, every path inside the bundle's folder, every
file the bundle needs checksummed), refuses a file whose sha256 differs from the
manifest's, then decodes the programs and the weights from the very bytes it
checked, and checks each program's arguments and results against the wire contract
and the weights. Every refusal is a `BundleError` subclass naming the file and the
field. No pickle is read anywhere.

The programs run on JAX's default device when they were lowered for its platform;
otherwise on the first device of a platform they were lowered for (on a TPU
machine, a bundle lowered for cpu and cuda runs on its CPU).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..extras import require
from .format import (
    DYNAMIC,
    BundleChecksumError,
    BundleFileMissingError,
    BundlePlatformError,
    BundleProgramError,
    sha256,
)
from .manifest import Manifest, WireSpec, read_manifest

NONFINITE_REFUSED = (
    "input {name!r}: {count} value{s} NaN or infinite (the first at index "
    "{index}); bundle {bundle!r} refuses them (its export declared "
    "nonfinite='refuse', the default). Replace them before the call, or export "
    "with ExportSpec({name!r}, ..., nonfinite='allow') when the model handles them."
)

PLATFORM_MISSING = (
    "load_bundle: {path} holds programs lowered for {platforms}, and this process "
    "has no device of those platforms (its default is {default}). Export the model "
    "again with StableHLOBundle(platforms=(..., {default!r})), or load the bundle in "
    "a process that has one of them (JAX_PLATFORMS)."
)


class LoadedBundle:
    """An exported model: call it with the wire inputs by name.

    Attributes:
        path: the bundle's folder.
        manifest: the manifest, as a dict (the wire contract, the programs, ...).
        name: the bundle's name.
        inputs / outputs: the wire contract, as `WireSpec`s in wire order.
        input_names / output_names: the wire tensors, in order.
        batch_sizes: the exported batch sizes.
        program_files: each program's file in the folder, by batch size (str(n),
            and "dynamic").

    Example::

        model = load_bundle("export/v1")
        out = model(x=np.zeros((7, 8), np.float32))   # {"logits": (7, 3) float32}
    """

    def __init__(
        self,
        path: str,
        manifest: Manifest,
        programs: dict[str, Any],
        weights: list[np.ndarray],
        device: Any = None,
    ) -> None:
        self.path = path
        self.manifest = manifest.data
        self.inputs = manifest.inputs
        self.outputs = manifest.outputs
        self.batch_sizes = manifest.batch_sizes
        self.name = manifest.name
        self.program_files = dict(manifest.programs)
        self._programs = programs
        self._weights = weights
        self.input_names = tuple(s.name for s in manifest.inputs)
        self.output_names = tuple(s.name for s in manifest.outputs)
        self._device = device  # None: JAX's default device

    def __repr__(self) -> str:
        return (
            f"LoadedBundle({self.name!r}, inputs={list(self.input_names)}, "
            f"outputs={list(self.output_names)})"
        )

    def __call__(self, **inputs: Any) -> dict[str, np.ndarray]:
        """Run the program on one batch of wire inputs.

        Args:
            **inputs: one array per wire input, by name, each of shape
                (batch, *sample_shape) in the manifest's dtype (a value that
                casts safely to it, such as a Python list of floats for float32,
                is converted). Every input has the same batch size.

        Returns:
            dict[str, np.ndarray]: each output by name, batch axis first.

        Raises:
            ConfigError: a missing or unknown input, a dtype that does not cast
                safely, a sample shape other than the manifest's, inputs that
                disagree on the batch size, or a NaN or infinite value in an
                input whose contract refuses them (`nonfinite="refuse"`).
        """
        wire = self._checked(inputs)
        n = wire[0].shape[0]
        exported = self._programs.get(str(n), self._programs[DYNAMIC])
        args, kwargs = exported.in_tree.unflatten([*self._weights, *wire])
        if self._device is not None:  # a call runs where its arguments are
            import jax

            args, kwargs = jax.device_put((args, kwargs), self._device)
        outputs = exported.call(*args, **kwargs)
        return {
            name: np.asarray(value)
            for name, value in zip(self.output_names, outputs, strict=True)
        }

    def check_inputs(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """The wire inputs checked and converted as a call would, by name.

        Args:
            inputs: one array per wire input, by name (see `__call__`).

        Returns:
            dict[str, np.ndarray]: each input in the manifest's dtype, C-contiguous.

        Raises:
            ConfigError: as `__call__`, naming the input and the manifest's spec.
        """
        return dict(zip(self.input_names, self._checked(inputs), strict=True))

    def _checked(self, inputs: Mapping[str, Any]) -> list[np.ndarray]:
        unknown = sorted(set(inputs) - set(self.input_names))
        missing = [n for n in self.input_names if n not in inputs]
        if unknown or missing:
            raise ConfigError(
                f"bundle {self.name!r} takes the inputs "
                f"{list(self.input_names)}; missing {missing}, unknown {unknown}."
            )
        wire = []
        sizes = set()
        for spec in self.inputs:
            value = np.asarray(inputs[spec.name])
            expected = spec.describe()
            if value.dtype != spec.dtype and not np.can_cast(
                value.dtype, spec.dtype, "safe"
            ):
                raise ConfigError(
                    f"input {spec.name!r}: dtype {value.dtype} does not cast safely "
                    f"to the bundle's {expected}; convert it before the call."
                )
            if value.ndim != len(spec.shape) or value.shape[1:] != spec.sample_shape:
                raise ConfigError(
                    f"input {spec.name!r}: shape {value.shape} does not match the "
                    f"bundle's {expected} (batch axis first)."
                )
            sizes.add(value.shape[0])
            array = np.require(value.astype(spec.dtype, copy=False), requirements="C")
            if spec.nonfinite == "refuse":
                self._check_finite(spec, array)
            wire.append(array)
        if len(sizes) != 1 or 0 in sizes:
            raise ConfigError(
                f"the inputs disagree on the batch size (or it is 0): {sorted(sizes)}; "
                "every input carries the same batch of samples."
            )
        return wire

    def _check_finite(self, spec: WireSpec, array: np.ndarray) -> None:
        if not _is_inexact(spec.dtype):
            return
        bad = ~np.isfinite(array)
        if bad.any():
            count = int(bad.sum())
            index = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ConfigError(
                NONFINITE_REFUSED.format(
                    name=spec.name,
                    count=count,
                    s=" is" if count == 1 else "s are",
                    index=list(index),
                    bundle=self.name,
                )
            )


def _is_inexact(dtype: np.dtype[Any]) -> bool:
    """Whether values of `dtype` can be NaN or infinite (bfloat16 and the float8s
    of ml_dtypes included)."""
    return dtype.kind in "fc" or (
        dtype.type.__module__ == "ml_dtypes" and "float" in dtype.name
    )


def load_bundle(path: str | os.PathLike[str]) -> LoadedBundle:
    """Load a StableHLO bundle written by `export_model`.

    Args:
        path: the bundle's folder.

    Returns:
        LoadedBundle: a callable taking the wire inputs by name.

    Raises:
        BundleFileMissingError: the manifest, or a file it lists, is missing.
        BundleVersionError: not a jaxnitro StableHLO bundle, or a format version
            newer than this jaxnitro reads.
        BundleManifestError: the manifest is too large, too deep, not JSON, or
            breaks the schema (a key missing or unknown, a wrong type, a dtype
            NumPy does not know, a needed file without a checksum).
        BundlePathError: a path in the manifest leaves the bundle's folder.
        BundleChecksumError: a file's sha256 differs from the manifest's.
        BundleProgramError: a program or the weights do not decode, or disagree
            with the manifest's wire contract or weight keys.
        BundlePlatformError: the programs were lowered for no platform this
            process has a device of.
    """
    shown = os.path.abspath(os.fspath(path))
    root = os.path.realpath(shown)
    manifest = read_manifest(root)
    needed = {*manifest.programs.values(), manifest.weights_file}
    verified: dict[str, bytes] = {}
    for name, digest in manifest.files.items():
        file = os.path.join(root, name)
        if not os.path.isfile(file):
            raise BundleFileMissingError(
                f"load_bundle: {file} is missing (or not a regular file); the "
                "manifest lists it. The bundle is incomplete: export it again or "
                "copy the whole folder.",
                file=file,
                field=f"files[{name!r}]",
            )
        try:
            if name in needed:  # checked and decoded from the same bytes
                with open(file, "rb") as f:
                    data = f.read()
                actual = hashlib.sha256(data).hexdigest()
                verified[name] = data
            else:
                actual = sha256(file)
        except OSError as error:
            raise BundleFileMissingError(
                f"load_bundle: {file} cannot be read ({error}).",
                file=file,
                field=f"files[{name!r}]",
            ) from error
        if actual != digest:
            raise BundleChecksumError(
                f"load_bundle: {file} has sha256 {actual}, but the manifest "
                f"records {digest}: it changed after the export. Refusing to run "
                "it; export the bundle again or restore the original file.",
                file=file,
                field=f"files[{name!r}]",
            )
    require("flatbuffers", extra="export", feature="load_bundle")
    weights = _weights(root, manifest, verified[manifest.weights_file])
    programs = {
        batch: _program(root, manifest, batch, verified[name], weights)
        for batch, name in manifest.programs.items()
    }
    device = run_device(shown, next(iter(programs.values())).platforms)
    return LoadedBundle(shown, manifest, programs, weights, device)


def _weights(root: str, manifest: Manifest, data: bytes) -> list[np.ndarray]:
    from safetensors.numpy import load

    file = os.path.join(root, manifest.weights_file)
    try:
        tensors = load(data)
    except Exception as error:  # the decoder's own error types vary
        raise BundleProgramError(
            f"load_bundle: {file} is not a readable safetensors file "
            f"({_error_name(error)}: {error}); it was altered after the export, its "
            "checksum updated with it. Export the bundle again.",
            file=file,
            field="weights.file",
        ) from error
    missing = [key for key in manifest.weight_keys if key not in tensors]
    if missing:
        raise BundleProgramError(
            f"load_bundle: {file} holds no tensor {missing[0]!r}, which the manifest "
            f"lists in weights.keys ({len(missing)} missing); the weights and the "
            "manifest come from different exports. Export the bundle again.",
            file=file,
            field="weights.keys",
        )
    return [tensors[key] for key in manifest.weight_keys]


def _program(
    root: str, manifest: Manifest, batch: str, data: bytes, weights: list[np.ndarray]
) -> Any:
    """Deserialize one program, checking it against the contract and weights."""
    from jax import export

    name = manifest.programs[batch]
    file = os.path.join(root, name)
    field = f"programs[{batch!r}]"

    def refuse(
        reason: str, why: str = "the program does not belong to this manifest"
    ) -> BundleProgramError:
        return BundleProgramError(
            f"load_bundle: {file} ({field}) {reason}; {why}. Export the bundle again.",
            file=file,
            field=field,
        )

    try:
        exported = export.deserialize(bytearray(data))
        avals = list(exported.in_avals)
        outs = list(exported.out_avals)
        leaves = exported.in_tree.num_leaves  # type: ignore[attr-defined]
    except Exception as error:  # flatbuffers raises struct.error, IndexError, ...
        raise refuse(
            f"is not a readable jax.export program ({_error_name(error)}: {error})",
            "it was altered after the export, its checksum updated with it",
        ) from error
    if leaves != len(avals) or len(avals) != len(weights) + len(manifest.inputs):
        raise refuse(
            f"takes {len(avals)} arguments, but the manifest gives it "
            f"{len(weights)} weight tensors and {len(manifest.inputs)} wire inputs"
        )
    for key, weight, aval in zip(manifest.weight_keys, weights, avals, strict=False):
        if tuple(aval.shape) != weight.shape or aval.dtype != weight.dtype:
            raise refuse(
                f"takes the weight {key!r} as {aval.str_short()}, but the weights "
                f"file holds {weight.dtype}{list(weight.shape)}"
            )
    fixed = None if batch == DYNAMIC else int(batch)
    groups = (
        ("input", manifest.inputs, avals[len(weights) :]),
        ("output", manifest.outputs, outs),
    )
    for kind, specs, group in groups:
        if len(specs) != len(group):
            raise refuse(
                f"has {len(group)} {kind}s, but the manifest declares {len(specs)}"
            )
        for spec, aval in zip(specs, group, strict=True):
            shape = tuple(aval.shape)
            if (
                aval.dtype != spec.dtype
                or shape[1:] != spec.sample_shape
                or (fixed is not None and shape[0] != fixed)
            ):
                raise refuse(
                    f"has the {kind} {spec.name!r} as {aval.str_short()}, but the "
                    f"manifest declares {spec.describe()} at batch size {batch}"
                )
    return exported


def _error_name(error: BaseException) -> str:
    """`struct.error` rather than a bare `error`; builtins by their plain name."""
    cls = type(error)
    module = cls.__module__
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"


def run_device(path: str, platforms: Sequence[str]) -> Any:
    """Where a bundle lowered for `platforms` runs: None (JAX's default device)
    when they include the default's platform, else the first device of the first
    of them this process has.

    Raises:
        BundlePlatformError: this process has no device of any of `platforms`.
    """
    import jax
    from jax import export

    default = export.default_export_platform()  # "cpu", "cuda", "rocm", "tpu"
    if default in platforms:
        return None
    for platform in platforms:
        try:
            return jax.devices(platform)[0]
        except RuntimeError:  # no such backend in this process
            continue
    raise BundlePlatformError(
        PLATFORM_MISSING.format(
            path=path, platforms=", ".join(platforms), default=default
        )
    )
