"""`sexpgpu explain`: a compiled run file read back in its own terms.

It prints the parameters and their element counts, each update group with the
parameters it holds, its optimizer states and the constants its schedule folded
to, what one step holds (micro-batches and records), how the steps fall into
cadence blocks, and each knob's kind: a graph constant (a new value traces a new
computation, so it compiles new programs) or a run value (read only by schedules,
hyperparameters, the data order or the run: a new value compiles nothing).
"""

from __future__ import annotations

import math
import textwrap
from typing import Any

from .engine import CompiledRun, GroupSettings, compile_run, graph_key
from .knobs import Selection
from .source import RunfileError, counted
from .stdlib_optim import ScheduleSpec

GRAPH = "graph constant (a new value compiles new programs)"
RUN_VALUE = (
    "run value (read by schedules, hyperparameters or the run: compiles nothing)"
)


def _elements(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def _rate(rate: float | ScheduleSpec, steps: int) -> str:
    if not isinstance(rate, ScheduleSpec):
        return f"constant {rate:g}"
    if rate.name == "constant":
        return f"constant {rate.peak:g}"
    warm = f"warmup {counted(rate.warmup_steps, 'step')}"
    if rate.name == "cosine":
        return f"cosine, peak {rate.peak:g}, {warm}, to 0 at step {steps}"
    decay = round(rate.decay_fraction * steps)
    return (
        f"warmup-stable-decay, peak {rate.peak:g}, {warm}, "
        f"stable to step {steps - decay}, linear to 0 at step {steps}"
    )


def _states(compiled: CompiledRun, group: GroupSettings, elements: int) -> str:
    if compiled.optimizer.rule == "adamw":
        return f"m, v ({counted(elements, 'element')} each) and a step count"
    if group.momentum:
        return f"momentum trace ({counted(elements, 'element')})"
    return "none"


def knob_kinds(path: str, selection: Selection | None = None) -> dict[str, str]:
    """Each knob's kind: `GRAPH` or `RUN_VALUE` (see the module docstring).

    A knob is tried at another value (an integer plus one, a float doubled): it is
    a graph constant when that traces another computation or no longer checks.
    """
    from .check import evaluate_checked

    selection = selection or Selection()
    result = evaluate_checked(path, selection)
    base = graph_key(result)
    kinds = {}
    for name, knob in result.knobs.knobs.items():
        value = knob.value
        if isinstance(value, bool) or not isinstance(value, int | float):
            kinds[name] = GRAPH  # not tried: strings, keywords, flags
            continue
        other = value + 1 if isinstance(value, int) else value * 2
        sets = (*selection.sets, (name, repr(other)))
        tried = Selection(selection.variant, selection.point, sets)
        try:
            changed = graph_key(evaluate_checked(path, tried)) != base
        except RunfileError:
            changed = True
        kinds[name] = GRAPH if changed else RUN_VALUE
    return kinds


def explain_lines(path: str, selection: Selection | None = None) -> list[str]:
    """The lines `sexpgpu explain` prints for one run file and knob selection."""
    compiled = compile_run(path, selection)
    shapes = compiled.model.parameter_shapes()
    total = sum(_elements(s) for s in shapes.values())
    run, plan = compiled.run, compiled.plan
    width = max(len(n) for n in shapes)
    lines = [
        f"parameters: {counted(len(shapes), 'array')}, {counted(total, 'element')}"
    ]
    lines += [
        f"  {name:<{width}}  {list(shape)!s:<14} {_elements(shape)}"
        for name, shape in shapes.items()
    ]
    lines.append(f"update groups ({compiled.optimizer.rule}): {len(compiled.groups)}")
    for group in compiled.groups:
        held = sum(_elements(shapes[p]) for p in group.parameters)
        label = "" if group.name == "default" else f" {group.selection}"
        lines.append(
            f"  {group.name}{label}: {counted(len(group.parameters), 'parameter')}, "
            f"{counted(held, 'element')}"
        )
        lines += textwrap.wrap(
            " ".join(group.parameters),
            88,
            initial_indent="    holds ",
            subsequent_indent="      ",
            break_on_hyphens=False,
        )
        lines.append("    states " + _states(compiled, group, held))
        lines.append("    lr " + _rate(group.lr, run.steps))
        settings = [f"weight-decay {group.weight_decay:g}"]
        if group.betas is not None:
            settings.insert(0, f"betas {group.betas[0]:g} {group.betas[1]:g}")
        if group.eps is not None:
            settings.insert(1, f"eps {group.eps:g}")
        if group.momentum:
            settings.insert(0, f"momentum {group.momentum:g}")
        lines.append("    " + ", ".join(settings))
    batch = compiled.train_loader.batch_size
    lines.append(
        f"step: {counted(run.microbatches, 'micro-batch', 'micro-batches')} of "
        f"{counted(batch, 'record')} ({counted(run.microbatches * batch, 'record')} "
        f"a step), precision {run.precision}"
    )
    lines.append(
        f"run: {counted(run.steps, 'step')} in {counted(plan.epochs, 'cadence block')}"
        f" of {counted(plan.cadence, 'step')} (engine epochs; the last of "
        f"{plan.steps_per_epoch[-1]}), seed {run.seed}"
    )
    for name, spec in compiled.eval_passes:
        limit = (
            "every record"
            if spec.batches is None
            else counted(spec.batches, "batch", "batches")
        )
        lines.append(
            f"evaluation pass {name}: {limit} of "
            f"{counted(spec.loader.batch_size, 'record')} every "
            f"{counted(compiled.every(spec), 'step')} and after the last"
        )
    if compiled.has_curriculum:
        lines.append(
            "curriculum: after each cadence block; a stage's :lr-scale and :loader "
            "apply from the next block"
        )
    kinds = knob_kinds(path, selection)
    if kinds:
        lines.append("knobs:")
        values = compiled.result.knobs.knobs
        lines += [
            f"  {name} {_show(values[name].value)}: {kind}"
            for name, kind in kinds.items()
        ]
    return lines


def _show(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
