"""`load_bundle`: a StableHLO bundle back as a callable, checked before it runs.

Loading reads the manifest, refuses a format version newer than this jaxnitro
writes, a missing file or one whose sha256 differs from the manifest's, then
deserializes the programs and the weights. No pickle is read anywhere.

The programs run on JAX's default device when they were lowered for its platform;
otherwise on the first device of a platform they were lowered for (on a TPU
machine, a bundle lowered for cpu and cuda runs on its CPU).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..extras import require
from .format import (
    DYNAMIC,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    BundleChecksumError,
    BundleFileMissingError,
    BundlePlatformError,
    BundleVersionError,
    sha256,
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
        input_names / output_names: the wire tensors, in order.

    Example::

        model = load_bundle("export/v1")
        out = model(x=np.zeros((7, 8), np.float32))   # {"logits": (7, 3) float32}
    """

    def __init__(
        self,
        path: str,
        manifest: dict[str, Any],
        programs: dict[str, Any],
        weights: list[np.ndarray],
        device: Any = None,
    ) -> None:
        self.path = path
        self.manifest = manifest
        self._programs = programs
        self._weights = weights
        self._device = device  # None: JAX's default device
        self.input_names = tuple(s["name"] for s in manifest["inputs"])
        self.output_names = tuple(s["name"] for s in manifest["outputs"])

    def __repr__(self) -> str:
        return (
            f"LoadedBundle({self.manifest['name']!r}, inputs={list(self.input_names)}, "
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
                safely, a sample shape other than the manifest's, or inputs that
                disagree on the batch size.
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
                f"bundle {self.manifest['name']!r} takes the inputs "
                f"{list(self.input_names)}; missing {missing}, unknown {unknown}."
            )
        wire = []
        sizes = set()
        for spec in self.manifest["inputs"]:
            value = np.asarray(inputs[spec["name"]])
            dtype = np.dtype(spec["dtype"])
            expected = (
                f"{spec['dtype']}[batch, {', '.join(map(str, spec['shape'][1:]))}]"
            )
            if value.dtype != dtype and not np.can_cast(value.dtype, dtype, "safe"):
                raise ConfigError(
                    f"input {spec['name']!r}: dtype {value.dtype} does not cast safely "
                    f"to the bundle's {expected}; convert it before the call."
                )
            if (
                value.ndim != len(spec["shape"])
                or list(value.shape[1:]) != spec["shape"][1:]
            ):
                raise ConfigError(
                    f"input {spec['name']!r}: shape {value.shape} does not match the "
                    f"bundle's {expected} (batch axis first)."
                )
            sizes.add(value.shape[0])
            wire.append(np.require(value.astype(dtype, copy=False), requirements="C"))
        if len(sizes) != 1 or 0 in sizes:
            raise ConfigError(
                f"the inputs disagree on the batch size (or it is 0): {sorted(sizes)}; "
                "every input carries the same batch of samples."
            )
        return wire


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
        BundleChecksumError: a file's sha256 differs from the manifest's.
        BundlePlatformError: the programs were lowered for no platform this
            process has a device of.
    """
    path = os.path.abspath(os.fspath(path))
    manifest_path = os.path.join(path, MANIFEST)
    if not os.path.isfile(manifest_path):
        raise BundleFileMissingError(
            f"load_bundle: {manifest_path} does not exist; {path} is not a bundle "
            "(export_model writes one with its manifest)."
        )
    with open(manifest_path, encoding="utf-8") as f:
        manifest = json.load(f)
    version = manifest.get("format_version")
    if manifest.get("format") != FORMAT or not isinstance(version, int):
        raise BundleVersionError(
            f"load_bundle: {manifest_path} declares format {manifest.get('format')!r} "
            f"version {version!r}; this jaxnitro reads {FORMAT!r}."
        )
    if version > FORMAT_VERSION:
        raise BundleVersionError(
            f"load_bundle: {path} has format version {version}, newer than the "
            f"{FORMAT_VERSION} this jaxnitro reads. Upgrade jaxnitro to load it."
        )
    for name, digest in manifest["files"].items():
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            raise BundleFileMissingError(
                f"load_bundle: {file} is missing; the manifest lists it. The bundle "
                "is incomplete: export it again or copy the whole folder."
            )
        if sha256(file) != digest:
            raise BundleChecksumError(
                f"load_bundle: {file} has sha256 {sha256(file)}, but the manifest "
                f"records {digest}: it changed after the export. Refusing to run "
                "it; export the bundle again or restore the original file."
            )
    require("flatbuffers", extra="export", feature="load_bundle")
    from jax import export
    from safetensors.numpy import load_file

    programs = {}
    for batch, name in manifest["programs"].items():
        with open(os.path.join(path, name), "rb") as f:
            programs[batch] = export.deserialize(bytearray(f.read()))
    device = run_device(path, next(iter(programs.values())).platforms)
    tensors = load_file(os.path.join(path, manifest["weights"]["file"]))
    weights = [tensors[key] for key in manifest["weights"]["keys"]]
    return LoadedBundle(path, manifest, programs, weights, device)


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
