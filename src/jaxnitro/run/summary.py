"""`Nitro.summary()`: a model's parameters by group, their bytes, the step's cost.

The parameters are counted per optimizer group (the `param_group` hook's names, in
the plan's order: "default" first), with their bytes by dtype. The FLOPs and bytes
of one optimizer step come from XLA's cost analysis (`run/costs.py`): of the
compiled train program once the handle has trained; before that, of the gradient
of one train batch (forward and backward, the optimizer's update left out), lowered
from abstract shapes and never compiled nor run, so a summary of an untrained
handle compiles nothing. The programs the handle compiled are listed with the
seconds each took to get and whether the compile cache served it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from ..compile.costs import program_costs
from ..compile.programs import gradient_fn
from ..experiment.traits import device_fields
from .costs import cost_rows, si_text, step_costs

if TYPE_CHECKING:
    from .view import RunView

FROM_PROGRAM = "XLA's cost analysis of the compiled train program (one step)"
FROM_LOWERED = (
    "XLA's cost analysis of the gradient of one train batch (forward and "
    "backward, without the optimizer update), lowered from shapes: nothing "
    "compiled or run"
)


@dataclass(frozen=True)
class GroupSummary:
    """One optimizer group's parameters.

    Attributes:
        name: the group's name ("default" for the default group).
        leaves: how many parameter arrays it holds.
        parameters: how many values they hold in all.
        bytes: their size in bytes.
        dtypes: `(dtype name, values)` per dtype, in order of first appearance.
    """

    name: str
    leaves: int
    parameters: int
    bytes: int
    dtypes: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class ProgramSummary:
    """One compiled program of the handle.

    Attributes:
        kind: the program ("train_step", "eval_forward", "eval_loss", ...).
        compile_seconds: the seconds the handle's first lookup took (tracing,
            lowering and XLA's compile; the key alone when the cache served it).
        cached: whether the module compile cache served it (nothing compiled).
        flops: XLA's estimate of the floating-point operations of one call.
        bytes_accessed: XLA's estimate of the bytes one call moves.
    """

    kind: str
    compile_seconds: float
    cached: bool
    flops: float | None
    bytes_accessed: float | None


@dataclass(frozen=True)
class ModelSummary:
    """What `Nitro.summary()` returns; `str()` of it is the printed table.

    Attributes:
        experiment: the experiment class's name.
        groups: the parameter groups, "default" first.
        parameters: the parameter values over every group.
        bytes: their bytes over every group.
        step_flops: FLOPs of one optimizer step by XLA's analysis (None when not
            estimated).
        step_bytes: bytes one optimizer step moves by the same analysis.
        step_source: where the step's figures come from (`FROM_PROGRAM`,
            `FROM_LOWERED`, or why there are none).
        programs: the handle's compiled programs, in the order it needed them.

    Example::

        print(Nitro(MyExp()).summary())
        # MyExp: 1,234 parameters (4.8 kB) in 1 group
        # group    leaves  parameters  bytes   dtypes
        # default       4       1,234  4.8 kB  float32 1,234
        # ...
    """

    experiment: str
    groups: tuple[GroupSummary, ...]
    parameters: int
    bytes: int
    step_flops: float | None
    step_bytes: float | None
    step_source: str
    programs: tuple[ProgramSummary, ...]

    def __str__(self) -> str:
        count = len(self.groups)
        lines = [
            f"{self.experiment}: {self.parameters:,} parameters "
            f"({_size(self.bytes)}) in {count} group{'s' if count != 1 else ''}"
        ]
        table = [("group", "leaves", "parameters", "bytes", "dtypes")]
        for g in self.groups:
            dtypes = ", ".join(f"{name} {n:,}" for name, n in g.dtypes)
            table.append(
                (g.name, str(g.leaves), f"{g.parameters:,}", _size(g.bytes), dtypes)
            )
        lines += _aligned(table, right=(1, 2, 3))
        if self.step_flops is None:
            lines.append(f"step cost: not estimated ({self.step_source})")
        else:
            lines.append(
                f"step cost: {si_text(self.step_flops, 'FLOP')}, "
                f"{si_text(self.step_bytes, 'B')} moved ({self.step_source})"
            )
        if not self.programs:
            lines.append("programs: none compiled yet")
            return "\n".join(lines)
        rows = [("program", "compile", "flops/call", "bytes/call")]
        for p in self.programs:
            when = "cached" if p.cached else f"{p.compile_seconds:.3g} s"
            flops, moved = si_text(p.flops, "FLOP"), si_text(p.bytes_accessed, "B")
            rows.append((p.kind, when, flops, moved))
        lines += _aligned(rows, right=(1, 2, 3))
        return "\n".join(lines)


def model_summary(nitro: RunView) -> ModelSummary:
    """The summary of `nitro`'s model and programs; see `Nitro.summary`."""
    groups = _groups(nitro)
    timings = nitro.executables.timings()
    programs = []
    for (kind, executable), (_, seconds, compiled) in zip(
        nitro.executables.compiled(), timings, strict=True
    ):
        flops, moved = program_costs(executable)
        programs.append(ProgramSummary(kind, seconds, not compiled, flops, moved))
    per_step = step_costs(cost_rows(nitro), nitro.config.accum)
    step_flops: float | None
    step_bytes: float | None
    if per_step is not None:
        step_flops, step_bytes, source = per_step[0], per_step[1], FROM_PROGRAM
    else:
        step_flops, step_bytes, source = _lowered_step(nitro)
    return ModelSummary(
        experiment=nitro.prepared.cls.__name__,
        groups=groups,
        parameters=sum(g.parameters for g in groups),
        bytes=sum(g.bytes for g in groups),
        step_flops=step_flops,
        step_bytes=step_bytes,
        step_source=source,
        programs=tuple(programs),
    )


def _groups(nitro: RunView) -> tuple[GroupSummary, ...]:
    leaves = jax.tree.leaves(nitro.parameters)
    plan = nitro.prepared.plan
    if plan is not None and len(plan.layout.labels) == len(leaves):
        names, labels = plan.layout.names, plan.layout.labels
    else:  # no train split: no optimizer plan, one group
        names, labels = ("default",), ("default",) * len(leaves)
    found: dict[str, dict[str, Any]] = {
        n: {"leaves": 0, "parameters": 0, "bytes": 0, "dtypes": {}} for n in names
    }
    for label, leaf in zip(labels, leaves, strict=True):
        entry = found.setdefault(
            label, {"leaves": 0, "parameters": 0, "bytes": 0, "dtypes": {}}
        )
        size = int(np.size(leaf))
        dtype = np.dtype(leaf.dtype)
        entry["leaves"] += 1
        entry["parameters"] += size
        entry["bytes"] += size * dtype.itemsize
        entry["dtypes"][dtype.name] = entry["dtypes"].get(dtype.name, 0) + size
    return tuple(
        GroupSummary(
            name,
            e["leaves"],
            e["parameters"],
            e["bytes"],
            tuple(e["dtypes"].items()),
        )
        for name, e in found.items()
    )


def _lowered_step(nitro: RunView) -> tuple[float | None, float | None, str]:
    """The gradient of one train batch by XLA's analysis of its lowering."""
    prepared = nitro.prepared
    routing = prepared.routing
    plan, fields, batch = prepared.plan, routing.gradient_fields, routing.train_batch
    if plan is None or fields is None or batch is None:
        return None, None, "no train split"
    if prepared.manual:
        return None, None, "manual mode: train an epoch for the train program's cost"
    if plan.perturbs:
        return None, None, "a perturbation rule: train an epoch for the cost"
    names = {*fields.forward, *fields.loss, *(fields.train_metrics or ())}
    try:
        shapes = {
            k: jax.ShapeDtypeStruct(
                (batch, *routing.sample_shapes[k]), np.dtype(routing.sample_dtypes[k])
            )
            for k in names
        }
    except (KeyError, TypeError):
        return None, None, "the train batch's shapes were not recorded"
    rng = jax.ShapeDtypeStruct((3,), np.uint32)
    compute = gradient_fn(prepared.ctx, fields, plan)
    args: tuple[Any, ...] = (
        {n: getattr(nitro.experiment, n) for n in device_fields(prepared.cls)},
        nitro.parameters,
        nitro.states,
        shapes,
        {},
        rng,
    )
    try:
        analysis = jax.jit(compute).lower(*args).cost_analysis()
        if analysis is None:  # a PJRT plugin's backend (a TPU): no lowered analysis
            analysis = jax.jit(compute).lower(*_on_host_cpu(args)).cost_analysis()
    except Exception as error:  # a backend or op XLA cannot cost
        return None, None, f"XLA gave no analysis ({type(error).__name__})"
    if isinstance(analysis, list | tuple):
        analysis = analysis[0] if analysis else {}
    flops = analysis.get("flops") if isinstance(analysis, dict) else None
    moved = analysis.get("bytes accessed") if isinstance(analysis, dict) else None
    if flops is None:
        return None, None, "XLA gave no analysis"
    return float(flops), None if moved is None else float(moved), FROM_LOWERED


def _on_host_cpu(args: Any) -> Any:
    """`args` as shapes on the host's CPU device: the same program lowered there,
    where XLA analyses a lowering (a TPU's plugin backend only analyses a compiled
    program, and compiling is what `summary` avoids). The FLOPs of the unoptimised
    program are the same on either."""
    cpu = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])

    def abstract(leaf: Any) -> Any:
        if not hasattr(leaf, "shape") or not hasattr(leaf, "dtype"):
            return leaf  # a Python number: not placed anywhere
        return jax.ShapeDtypeStruct(np.shape(leaf), leaf.dtype, sharding=cpu)

    return jax.tree.map(abstract, args)


def _aligned(rows: Sequence[tuple[str, ...]], *, right: tuple[int, ...]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            cell.rjust(w) if i in right else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]


def _size(n: int) -> str:
    return si_text(float(n), "B")
