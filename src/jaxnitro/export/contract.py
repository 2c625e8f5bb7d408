"""The wire contract: the export hooks read and checked against each other.

Everything here runs before a file is written: first the hooks alone
(`read_contract`), then the output specs against what the eager probe of forward
returned (`check_outputs`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import HookError
from .spec import ExportSpec, check_specs

ECHO_WITHOUT_FROM = (
    "export_outputs: ExportSpec({name!r}) names the wire input {name!r}, which makes "
    "it an echo; an echo must say so with from_: ExportSpec({name!r}, "
    "from_={name!r}) (or rename it: ExportSpec('{name}_echo', from_={name!r}))."
)
CLIENT_WITHOUT_POSTPROCESS = (
    "{hook} is declared but export_postprocess is not: a client's tensors differ "
    "from the program's only through a postprocess. Define export_postprocess (the "
    "source that ships as postprocess.py) or drop {hook}."
)


@dataclass(frozen=True)
class ExportContract:
    """What the export hooks declared, checked against each other.

    Attributes:
        inputs: `export_inputs`, in wire order.
        outputs: `export_outputs`, in shipping order.
        client_inputs: `export_client_inputs`, or None.
        client_outputs: `export_client_outputs`, or None.
        postprocess: `export_postprocess`'s source, or None.
    """

    inputs: tuple[ExportSpec, ...]
    outputs: tuple[ExportSpec, ...]
    client_inputs: tuple[ExportSpec, ...] | None
    client_outputs: tuple[ExportSpec, ...] | None
    postprocess: str | None

    def as_json(self) -> dict[str, Any]:
        """The contract as manifest data."""

        def specs(group: tuple[ExportSpec, ...] | None) -> Any:
            return None if group is None else [s.as_json() for s in group]

        return {
            "inputs": [{**s.as_json(), "nonfinite": s.nonfinite} for s in self.inputs],
            "outputs": specs(self.outputs),
            "client_inputs": specs(self.client_inputs),
            "client_outputs": specs(self.client_outputs),
            "postprocess": None if self.postprocess is None else "postprocess.py",
        }


def read_contract(e: Any) -> ExportContract:
    """Call the export hooks on `e` and check them against each other.

    Raises:
        HookError: a hook broke its own rules (`check_specs`), an output names a
            wire input without `from_`, a postprocess is not a string, or client
            specs are declared without a postprocess.
    """
    inputs = check_specs("export_inputs", e.export_inputs())
    outputs = check_specs("export_outputs", e.export_outputs())
    wire = {spec.name for spec in inputs}
    for spec in outputs:
        if spec.from_ is None and spec.name in wire:
            raise HookError(ECHO_WITHOUT_FROM.format(name=spec.name))
    postprocess = e.export_postprocess()
    if postprocess is not None and not isinstance(postprocess, str):
        raise HookError(
            f"export_postprocess must return the postprocess's Python source as a "
            f"str, or None; got {type(postprocess).__name__}."
        )
    client: dict[str, tuple[ExportSpec, ...] | None] = {}
    for hook in ("export_client_inputs", "export_client_outputs"):
        value = getattr(e, hook)()
        if value is not None and postprocess is None:
            raise HookError(CLIENT_WITHOUT_POSTPROCESS.format(hook=hook))
        client[hook] = None if value is None else check_specs(hook, value)
    return ExportContract(
        inputs=inputs,
        outputs=outputs,
        client_inputs=client["export_client_inputs"],
        client_outputs=client["export_client_outputs"],
        postprocess=postprocess,
    )


def check_outputs(
    contract: ExportContract,
    outputs: Any,
    select: Callable[[Any], tuple[Any, ...]],
    n: int,
) -> tuple[ExportSpec, ...]:
    """Check the output specs against forward's outputs on a probe of batch `n`;
    `select` maps those outputs to the shipped tuple.

    Returns:
        The output specs completed with the traced dtype and shape (batch axis
        size 1 as the placeholder), in shipping order.

    Raises:
        HookError: a source names neither an output of forward nor a wire input,
            a bare array output with more than one spec, an output without the
            batch axis first, or a declared dtype or shape that disagrees with
            the trace.
    """
    wire = {spec.name for spec in contract.inputs}
    keys = list(outputs) if isinstance(outputs, Mapping) else None
    sources = [spec for spec in contract.outputs if spec.source not in wire]
    if keys is None and len(sources) > 1:
        raise HookError(
            f"export_outputs declares {len(sources)} outputs of forward "
            f"({', '.join(s.name for s in sources)}), but forward returns a bare "
            f"{type(outputs).__name__}; declare exactly one spec, or return a dict."
        )
    for spec in sources:
        if keys is not None and spec.source not in keys:
            raise HookError(
                f"export_outputs: ExportSpec({spec.name!r}) takes its value from "
                f"{spec.source!r}, which is neither an output of forward (it returns "
                f"{', '.join(map(str, keys)) or 'nothing'}) nor a wire input. Name "
                "one of those, or give from_= the source."
            )
    completed = []
    for spec, value in zip(contract.outputs, select(outputs), strict=True):
        array = np.asarray(value)
        if array.ndim == 0 or array.shape[0] != n:
            raise HookError(
                f"export_outputs: {spec.name!r} has shape {array.shape} on a batch "
                f"of {n}; every shipped output has the batch axis first. Return it "
                "with shape (batch, ...) from forward."
            )
        traced = (1, *array.shape[1:])
        if spec.dtype is not None and (
            spec.dtype != array.dtype
            or spec.shape is None
            or spec.shape[1:] != traced[1:]
        ):
            raise HookError(
                f"export_outputs: ExportSpec({spec.name!r}) declares "
                f"{spec.dtype}{list(spec.shape or ())}, but the program computes "
                f"{array.dtype}{list(traced)} (batch axis excluded from the "
                "comparison). Fix the declaration, or leave dtype and shape out to "
                "take them from the trace."
            )
        completed.append(
            ExportSpec(
                spec.name,
                array.dtype,
                traced,
                axis_letters=spec.axis_letters,
                from_=spec.from_,
            )
        )
    return tuple(completed)
