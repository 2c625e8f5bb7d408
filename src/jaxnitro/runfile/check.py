"""`sexpgpu check`: evaluate, check the contract and the shapes, count.

Shapes are checked by tracing, with `jax.eval_shape`, one microbatch of the
train loader's declared fields through `prepare`, the model and `objective` (and
each evaluation pass through `eval-prepare`, the model and `evaluate`): nothing
is compiled or allocated, and no data file is opened.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .contract import check_contract
from .evaluator import Evaluated, Evaluator
from .knobs import Selection
from .reader import read_file
from .source import RunfileError, Span, fail
from .stdlib_data import Batch, LoaderSpec
from .values import keyword_list, kind_of


@dataclass(frozen=True)
class CheckReport:
    """What `check` found: parameter arrays and elements, programs, steps."""

    parameters: int
    elements: int
    graphs: int
    steps: int
    groups: dict[str, list[str]]

    def line(self) -> str:
        """The spec's line: `ok: 32 parameters, 2 graphs, 20 steps`."""
        return (
            f"ok: {self.parameters} parameters, {self.graphs} graphs, "
            f"{self.steps} steps"
        )


def evaluate_checked(path: str, selection: Selection | None = None) -> Evaluated:
    """Read and evaluate `path`, then check its contract (every error at once)."""
    result = Evaluator(path, selection or Selection(), ()).program(read_file(path))
    check_contract(result)
    return result


def check_file(path: str, selection: Selection | None = None) -> CheckReport:
    """Everything `sexpgpu check` verifies of one file (and one knob selection).

    Raises:
        RunfileError: the coded diagnostics (E-READ, E-EVAL, E-KNOB, E-ORDER,
            E-CONTRACT, E-LOAD, E-SHAPE).
    """
    import jax

    result = evaluate_checked(path, selection)
    model = result.value("model")
    shapes = model.parameter_shapes()
    params = {n: jax.ShapeDtypeStruct(s, "float32") for n, s in shapes.items()}
    prepare = result.value("prepare")
    eval_prepare = (
        result.value("eval-prepare") if "eval-prepare" in result.defined else prepare
    )
    ev = Evaluator(path, Selection(), ())
    passes: list[tuple[str, LoaderSpec, Any, Any, Span]] = [
        (
            "objective",
            result.value("train-loader"),
            prepare,
            result.value("objective"),
            result.defined["objective"],
        )
    ]
    passes += [
        (
            f"evaluate (pass {name})",
            spec.loader,
            eval_prepare,
            result.value("evaluate"),
            span,
        )
        for name, spec, span in result.evals
    ]
    for what, loader, prep, score, span in passes:

        def step(
            p: Any,
            batch: dict[str, Any],
            prep: Any = prep,
            score: Any = score,
            what: str = what,
            span: Span = span,
        ) -> Any:
            prepared = keyword_list(ev.call(prep, [Batch(batch)], span))
            if prepared is None or not {"inputs", "targets"} <= set(prepared):
                raise fail(
                    "E-SHAPE-006",
                    "prepare must return (list :inputs ... :targets ...)",
                    span,
                )
            prediction = model.apply(p, prepared["inputs"], span)
            return _scalars(
                ev.call(score, [prediction, prepared["targets"]], span), what, span
            )

        try:
            jax.eval_shape(step, params, loader.batch_shapes())
        except RunfileError:
            raise
        except Exception as error:  # noqa: BLE001 - JAX's shape errors, coded
            raise fail(
                "E-SHAPE-007",
                f"tracing {what} failed: {error}",
                span,
                "check the shapes prepare passes to the model",
            ) from None
    run = result.run
    check_passes(result)
    graphs = (1 if run.microbatches == 1 else 2) + len(result.evals)
    optimizer = result.value("optimizer")
    return CheckReport(
        len(shapes),
        sum(_size(s) for s in shapes.values()),
        graphs,
        run.steps,
        optimizer.assign(shapes),
    )


def check_passes(result: Evaluated) -> None:
    """Refuse evaluation passes the run cannot schedule.

    Raises:
        RunfileError: E-RUN-007 for a pass named `train` (the train split's name)
            or named twice; E-RUN-004 for an `:every` that is not a multiple of
            defrun's `:cadence` (a pass runs where a cadence block ends).
    """
    seen: set[str] = set()
    cadence = result.run.cadence
    for name, spec, span in result.evals:
        if name == "train" or name in seen:
            raise fail(
                "E-RUN-007",
                f"an evaluation pass named `{name}`"
                + (" twice" if name in seen else ", the train split's name"),
                span,
                "give each (defeval NAME ...) a name of its own, other than train",
            )
        seen.add(name)
        if spec.every is not None and spec.every % cadence:
            raise fail(
                "E-RUN-004",
                f"pass `{name}` runs :every {spec.every} steps, which is not a "
                f"multiple of defrun's :cadence {cadence}: a pass runs where a "
                "cadence block ends",
                span,
                f"use :every {max(cadence, spec.every // cadence * cadence)}, or "
                "leave :every out (after every block)",
            )


def _size(shape: tuple[int, ...]) -> int:
    count = 1
    for n in shape:
        count *= n
    return count


def _scalars(value: Any, what: str, span: Span) -> Any:
    metrics = keyword_list(value) if what.startswith("evaluate") else None
    values = metrics.values() if metrics is not None else [value]
    for v in values:
        if getattr(v, "shape", None) != () or "float" not in str(v.dtype):
            raise fail(
                "E-SHAPE-008",
                f"{what} must return a float scalar"
                + (" per metric" if metrics is not None else "")
                + f", got {kind_of(v)}",
                span,
                "reduce it: (cross-entropy prediction targets) is a scalar",
            )
    return tuple(values)
