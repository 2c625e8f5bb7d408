"""`ExportSpec`: one tensor's declaration for export, and the rules per hook.

Which fields a spec needs depends on the hook that returns it. The executable side
(`export_inputs`, `export_outputs`) is traced, so its shapes are known and the batch
axis must come first; the client side (`export_client_inputs`,
`export_client_outputs`) describes what a postprocess the framework never runs
receives or produces, so it is declared in full.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConfigError, HookError

EXECUTABLE_HOOKS = ("export_inputs", "export_outputs")
CLIENT_HOOKS = ("export_client_inputs", "export_client_outputs")
NONFINITE = ("refuse", "allow")


@dataclass(frozen=True)
class ExportSpec:
    """One tensor of an exported model's wire contract.

    Args:
        name: the tensor's name in the bundle (a non-empty string).
        dtype: its dtype, anything `np.dtype` reads ("float32", `np.uint8`).
        shape: its shape, batch axis included; the batch axis's size is a
            placeholder replaced by each exported batch size. A -1 marks a
            variable non-batch axis (client specs only).
        batch_axis: the batch axis, 0 (first) by default; the executable side
            requires 0.
        axis_letters: one letter per non-batch axis, in shape order, such as
            "hwc"; a string or a sequence of one-character strings.
        from_: the source of an output when it is not its own name: a key of
            `forward`'s outputs (a rename) or a wire input (an echo). Only
            `export_outputs` accepts it.
        nonfinite: what a loaded bundle and `nitro serve` do with NaN and
            infinite values in this wire input: "refuse" (the default: the call
            raises, the server answers 400 naming the input) or "allow" (they
            reach the program). Only `export_inputs` accepts "allow"; it is
            written to the manifest as the input's `nonfinite`.

    Raises:
        ConfigError: an empty name, an unknown dtype, a shape with a size below 1
            other than -1, a batch axis outside the shape, axis letters whose
            count is not the number of non-batch axes, a `from_` that is not a
            non-empty string, or a `nonfinite` other than "refuse" and "allow".

    Examples:
        >>> spec = ExportSpec("img", "uint8", (1, 28, 28), axis_letters="hw")
        >>> spec.dtype, spec.shape, spec.batch_axis, spec.axis_letters
        (dtype('uint8'), (1, 28, 28), 0, ('h', 'w'))
        >>> ExportSpec("probs", from_="logits").source
        'logits'
    """

    name: str
    dtype: np.dtype[Any] | None = None
    shape: tuple[int, ...] | None = None
    batch_axis: int = 0
    axis_letters: tuple[str, ...] | None = None
    from_: str | None = None
    nonfinite: str = "refuse"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(
                f"ExportSpec: name must be a non-empty string, got {self.name!r}."
            )
        where = f"ExportSpec({self.name!r})"
        if self.dtype is not None:
            try:
                object.__setattr__(self, "dtype", np.dtype(self.dtype))
            except TypeError as error:
                raise ConfigError(
                    f"{where}: dtype={self.dtype!r} is not a dtype NumPy reads "
                    f"({error}). Pass a name such as 'float32' or a type such as "
                    "np.uint8."
                ) from error
        if self.shape is not None:
            shape = tuple(self.shape)
            if not all(isinstance(s, int | np.integer) for s in shape) or any(
                s < 1 and s != -1 for s in shape
            ):
                raise ConfigError(
                    f"{where}: shape={self.shape!r} must be a sequence of sizes >= 1 "
                    "(or -1 for a variable non-batch axis)."
                )
            object.__setattr__(self, "shape", tuple(int(s) for s in shape))
            if not 0 <= self.batch_axis < max(len(shape), 1) or not shape:
                raise ConfigError(
                    f"{where}: batch_axis={self.batch_axis} is outside shape "
                    f"{shape}; the shape includes the batch axis, first by default: "
                    f"shape=(1, *sample_shape)."
                )
        if self.axis_letters is not None:
            letters = tuple(self.axis_letters)
            if not all(isinstance(a, str) and len(a) == 1 for a in letters):
                raise ConfigError(
                    f"{where}: axis_letters={self.axis_letters!r} must be one letter "
                    "per non-batch axis, such as 'hwc'."
                )
            if self.shape is not None and len(letters) != len(self.shape) - 1:
                raise ConfigError(
                    f"{where}: axis_letters={''.join(letters)!r} names "
                    f"{len(letters)} axes, but shape {self.shape} has "
                    f"{len(self.shape) - 1} non-batch axes; give one letter each."
                )
            object.__setattr__(self, "axis_letters", letters)
        if self.from_ is not None and (
            not isinstance(self.from_, str) or not self.from_
        ):
            raise ConfigError(
                f"{where}: from_={self.from_!r} must be a non-empty string naming an "
                "output of forward or a wire input."
            )

        if self.nonfinite not in NONFINITE:
            raise ConfigError(
                f"{where}: nonfinite={self.nonfinite!r} must be 'refuse' (NaN and "
                "infinite inputs are refused, the default) or 'allow' (they reach "
                "the program)."
            )

    @property
    def source(self) -> str:
        """Where an output's value comes from: `from_`, else the name."""
        return self.from_ if self.from_ is not None else self.name

    def as_json(self) -> dict[str, Any]:
        """The spec as manifest data (the dtype by name)."""
        return {
            "name": self.name,
            "dtype": None if self.dtype is None else self.dtype.name,
            "shape": None if self.shape is None else list(self.shape),
            "batch_axis": self.batch_axis,
            "axis_letters": None
            if self.axis_letters is None
            else "".join(self.axis_letters),
        }


def check_specs(hook: str, specs: Any) -> tuple[ExportSpec, ...]:
    """Check what hook `hook` returned against that hook's rules.

    Args:
        hook: "export_inputs", "export_outputs", "export_client_inputs" or
            "export_client_outputs".
        specs: the hook's return value: a sequence of `ExportSpec`.

    Returns:
        The specs as a tuple.

    Raises:
        HookError: not a non-empty sequence of `ExportSpec`, a repeated name, a
            `from_` on any hook but export_outputs, a missing dtype or shape where
            the hook needs one, a -1 axis or a batch axis other than 0 on the
            executable side, a declared output dtype or shape that is incomplete.
    """
    if not isinstance(specs, Sequence) or isinstance(specs, str) or not specs:
        raise HookError(
            f"{hook} must return a non-empty list of ExportSpec, got {specs!r}. "
            f"Example: return [ExportSpec('x', 'float32', (1, 8))]."
        )
    seen: set[str] = set()
    for spec in specs:
        if not isinstance(spec, ExportSpec):
            raise HookError(
                f"{hook} returned a {type(spec).__name__} ({spec!r}) among its "
                "specs; every entry must be an ExportSpec."
            )
        if spec.name in seen:
            raise HookError(
                f"{hook} declares {spec.name!r} twice; tensor names are unique."
            )
        seen.add(spec.name)
        _check_one(hook, spec)
    return tuple(specs)


def _check_one(hook: str, spec: ExportSpec) -> None:
    where = f"{hook}: ExportSpec({spec.name!r})"
    if spec.from_ is not None and hook != "export_outputs":
        raise HookError(
            f"{where} has from_={spec.from_!r}, which only export_outputs accepts "
            "(a rename or an echo of a wire input). Remove it."
        )
    if spec.nonfinite != "refuse" and hook != "export_inputs":
        raise HookError(
            f"{where} has nonfinite={spec.nonfinite!r}, which only export_inputs "
            "accepts (whether a wire input may carry NaN or infinite values). "
            "Remove it."
        )
    needs_full = hook != "export_outputs"
    if needs_full and (spec.dtype is None or spec.shape is None):
        raise HookError(
            f"{where} needs a dtype and a shape: {_why(hook)} Example: "
            f"ExportSpec({spec.name!r}, 'float32', (1, 8))."
        )
    if hook in EXECUTABLE_HOOKS and spec.batch_axis != 0:
        raise HookError(
            f"{where} has batch_axis={spec.batch_axis}; the exported program takes "
            "and returns the batch axis first. Move it to axis 0."
        )
    if hook in EXECUTABLE_HOOKS and spec.shape is not None and -1 in spec.shape:
        raise HookError(
            f"{where} has a variable (-1) axis in shape {spec.shape}; the executable "
            "side is traced at fixed sizes (only its batch axis varies). Give the "
            "size, or declare the variable axis on export_client_inputs/outputs."
        )
    if hook == "export_outputs" and (spec.dtype is None) != (spec.shape is None):
        raise HookError(
            f"{where} gives only one of dtype and shape; give both, to be checked "
            "against the trace, or neither, to take them from it."
        )


def _why(hook: str) -> str:
    if hook == "export_inputs":
        return "the framework builds the example arrays it traces from them."
    return "the client side runs outside the framework, which cannot derive them."
