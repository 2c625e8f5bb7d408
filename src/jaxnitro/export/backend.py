"""`ExportBackend`: the protocol an export target implements, and what it is given."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from .contract import ExportContract
from .program import ExportProgram


@dataclass(frozen=True)
class ExportRequest:
    """Everything `export_model` hands a backend besides the program and weights.

    Attributes:
        dir: the folder to fill: empty, and renamed into place by `export_model`
            once `write_export` returns (so a failed export leaves no bundle).
        name: the bundle's name.
        contract: the wire contract, its output specs completed from the trace.
        batch_sizes: the batch sizes to compile a program for, in order.
        provenance: the merged provenance (its `git_diff`, if any, included).
    """

    dir: str
    name: str
    contract: ExportContract
    batch_sizes: tuple[int, ...]
    provenance: Mapping[str, Any]


@runtime_checkable
class ExportBackend(Protocol):
    """An export target: writes one artifact format.

    `write_export(program, params, state, example_inputs, request)` writes the
    artifact into `request.dir` and returns the path written. `program` is called
    as `program(params, state, *wire)` and returns the shipped outputs in order;
    `params` and `state` are host trees (state as eval mode leaves it);
    `example_inputs` is a tuple of host wire arrays at the first batch size.
    """

    def write_export(
        self,
        program: ExportProgram,
        params: Any,
        state: Any,
        example_inputs: tuple[Any, ...],
        request: ExportRequest,
    ) -> str: ...
