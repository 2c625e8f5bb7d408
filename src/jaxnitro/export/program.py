"""`ExportProgram`: the function an export traces, from wire inputs to shipped outputs.

It carries `export_view(e)`, the forward hook, the routing, the preprocess and the
echoes, and runs forward in eval mode. `outputs` returns forward's full output (what
the probe reads); calling the program returns the ordered tuple that ships.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import HookError, RoutingError
from ..experiment.modes import training_mode
from ..experiment.rng import EVAL_RNG_INPUT, step_rng_scope
from ..experiment.routing import HookFields
from .spec import ExportSpec


@dataclass(frozen=True, eq=False)
class ExportProgram:
    """Wire inputs to outputs, as the exported program computes them.

    Attributes:
        view: `export_view` of the experiment (Device fields baked on the host).
        model: the static model object `build_model` returned.
        forward: the frozen forward hook, called as `forward(view, model, params,
            state, **batch)`.
        preprocess: `export_preprocess` as `fn(view, *wire)`, or None when the
            experiment keeps the default (each wire input is the batch field of
            its name).
        fields: the batch fields forward declares.
        inputs: the `export_inputs` specs, in wire order.
        outputs_spec: the `export_outputs` specs, in shipping order.
    """

    view: Any
    model: Any
    forward: Callable[..., Any]
    preprocess: Callable[..., Any] | None
    fields: HookFields
    inputs: tuple[ExportSpec, ...]
    outputs_spec: tuple[ExportSpec, ...]

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(spec.name for spec in self.inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(spec.name for spec in self.outputs_spec)

    def batch(self, wire: tuple[Any, ...]) -> dict[str, Any]:
        """The batch forward receives: the preprocess's, or the wire by name."""
        if self.preprocess is None:
            return dict(zip(self.input_names, wire, strict=True))
        batch = self.preprocess(self.view, *wire)
        if batch is None:  # the base default
            return dict(zip(self.input_names, wire, strict=True))
        if hasattr(batch, "_asdict"):
            batch = batch._asdict()
        if not isinstance(batch, Mapping):
            raise HookError(
                f"export_preprocess must return a dict of batch fields (or None), "
                f"got {type(batch).__name__}. Return e.g. {{'x': wire_x / 255}}."
            )
        return dict(batch)

    def outputs(self, params: Any, state: Any, *wire: Any) -> Any:
        """Forward's full output on the wire inputs, in eval mode."""
        batch = self.batch(wire)
        try:
            names = self.fields.select(tuple(batch))
        except RoutingError as error:
            raise HookError(
                f"{error} In an export the batch is what export_preprocess returns "
                f"(by default the wire inputs {list(self.input_names)}): declare the "
                "field in export_inputs or produce it in export_preprocess."
            ) from None
        with training_mode(False), step_rng_scope(EVAL_RNG_INPUT):
            result = self.forward(
                self.view, self.model, params, state, **{k: batch[k] for k in names}
            )
        if not (isinstance(result, tuple) and len(result) == 2):
            raise HookError(
                "`forward` must return (outputs, new_state); it returned "
                f"{type(result).__name__}."
            )
        return result[0]

    def select(self, outputs: Any, wire: tuple[Any, ...]) -> tuple[Any, ...]:
        """The shipped tuple: each output spec's source, from forward's outputs or,
        for an echo, the wire input as the client sent it."""
        wired = dict(zip(self.input_names, wire, strict=True))
        shipped = []
        for spec in self.outputs_spec:
            if spec.source in wired:
                shipped.append(wired[spec.source])
            elif isinstance(outputs, Mapping):
                shipped.append(outputs[spec.source])
            else:
                shipped.append(outputs)
        return tuple(shipped)

    def __call__(self, params: Any, state: Any, *wire: Any) -> tuple[Any, ...]:
        return self.select(self.outputs(params, state, *wire), wire)
