"""`sexpgpu check`: evaluate, check the contract and the shapes, count.

Shapes are checked by tracing, with `jax.eval_shape`, one microbatch of the
train loader's declared fields through `prepare`, the model and `objective` (and
each evaluation pass through `eval-prepare`, the model and `evaluate`): nothing
is compiled or allocated, and no data file is opened.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..experiment.modes import training_mode
from .bounds import PARAMETERS_MAX
from .contract import contract_errors, fits
from .evaluator import Evaluated, Evaluator
from .knobs import Selection
from .names import undefined_names
from .nn_cudnn import shapes_only
from .reader import read_file
from .source import Diagnostic, RunfileError, Span, counted, fail
from .stdlib_data import Batch, LoaderSpec, RunSpec, finite_train_loader
from .stdlib_optim import group_errors
from .values import SkippedError, keyword_list, kind_of


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
            f"ok: {counted(self.parameters, 'parameter')}, "
            f"{counted(self.graphs, 'graph')}, {counted(self.steps, 'step')}"
        )


def diagnose(
    path: str, selection: Selection | None = None
) -> tuple[Evaluated, list[Diagnostic]]:
    """Read and evaluate `path`, going on past each failed form; the result and
    every diagnostic found: each failed form's, the contract's and the undefined
    names of function bodies (found without calling them).

    Raises:
        RunfileError: E-READ-* (a file that cannot be read is not evaluated).
    """
    program = read_file(path)
    evaluator = Evaluator(path, selection or Selection(), (), collect=True)
    result = evaluator.program(program)
    found = [
        *result.errors,
        *contract_errors(result),
        *undefined_names(program, result.scope),
    ]
    return result, found


def raise_found(found: list[Diagnostic]) -> None:
    """Raise every diagnostic of `found` at once, in file order, each once."""
    if not found:
        return
    unique = list(
        {(d.code, d.message, d.span and d.span.where): d for d in found}.values()
    )
    unique.sort(
        key=lambda d: (
            d.span is None,
            d.span.line if d.span else 0,
            d.span.col if d.span else 0,
        )
    )
    raise RunfileError(unique)


def evaluate_checked(path: str, selection: Selection | None = None) -> Evaluated:
    """Read and evaluate `path`, then check its contract (every error at once)."""
    result, found = diagnose(path, selection)
    raise_found(found)
    return result


def check_file(path: str, selection: Selection | None = None) -> CheckReport:
    """Everything `sexpgpu check` verifies of one file (and one knob selection).

    Every error it can find is reported at once: a part of the contract that
    evaluated is traced even when another part is missing or failed.

    Raises:
        RunfileError: the coded diagnostics (E-READ, E-EVAL, E-KNOB, E-ORDER,
            E-CONTRACT, E-LOAD, E-SHAPE).
    """
    result, found = diagnose(path, selection)

    def usable(*names: str) -> bool:
        return all(result.usable(n) and fits(n, result.value(n)) for n in names)

    if usable("model"):
        too_big = _too_big(result.value("model"), result.defined["model"])
        found += too_big or _trace(path, result)
    if usable("model", "optimizer"):
        shapes = result.value("model").parameter_shapes()
        found += group_errors(result.value("optimizer"), shapes)
    if usable("train-loader"):
        finite = finite_train_loader(
            result.value("train-loader"), "train-loader", result.defined["train-loader"]
        )
        found += [finite] if finite else []
    if isinstance(result.run, RunSpec):
        found += pass_errors(result)
    raise_found(found)
    model = result.value("model")
    shapes = model.parameter_shapes()
    run = result.run
    graphs = (1 if run.microbatches == 1 else 2) + len(result.evals)
    optimizer = result.value("optimizer")
    return CheckReport(
        len(shapes),
        sum(_size(s) for s in shapes.values()),
        graphs,
        run.steps,
        optimizer.assign(shapes),
    )


def _too_big(model: Any, span: Span) -> list[Diagnostic]:
    """E-SHAPE-012 for a model of more than `PARAMETERS_MAX` parameter elements
    (each size within its own bound, the product may not be)."""
    elements = sum(_size(s) for s in model.parameter_shapes().values())
    if elements <= PARAMETERS_MAX:
        return []
    return [
        Diagnostic(
            "E-SHAPE-012",
            f"`model` holds {elements} parameter elements, over the bound of "
            f"{PARAMETERS_MAX} (4 TiB of float32): no machine trains a model of "
            "that size",
            span,
            "make it smaller: fewer :layers, a smaller :dim or :vocab",
        )
    ]


def _trace(path: str, result: Evaluated) -> list[Diagnostic]:
    """Trace each pass whose parts evaluated (the train objective, then each
    evaluation pass) with `jax.eval_shape`; the diagnostics of every failure."""
    import jax

    def usable(*names: str) -> bool:
        return all(result.usable(n) and fits(n, result.value(n)) for n in names)

    # Shape inference per block: the probe (a one-block gpt) takes and gives
    # what the model does, so its trace checks the model at any depth.
    model = result.value("model").probe()
    params = {
        n: jax.ShapeDtypeStruct(s, "float32")
        for n, s in model.parameter_shapes().items()
    }
    prepare_name = "eval-prepare" if "eval-prepare" in result.defined else "prepare"
    ev = Evaluator(path, Selection(), ())
    passes: list[tuple[str, LoaderSpec, Any, Any, Span]] = []
    if usable("train-loader", "prepare", "objective"):
        passes.append(
            (
                "objective",
                result.value("train-loader"),
                result.value("prepare"),
                result.value("objective"),
                result.defined["objective"],
            )
        )
    if usable(prepare_name, "evaluate"):
        passes += [
            (
                f"evaluate (pass {name})",
                spec.loader,
                result.value(prepare_name),
                result.value("evaluate"),
                span,
            )
            for name, spec, span in result.evals
        ]
    found: list[Diagnostic] = []
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
            # The objective as the train program traces it: in train mode (a
            # `gpt :loss-chunks` prediction is then `nn_xent.ChunkedLogits`);
            # shapes only, so `gpt :attention :cudnn` traces where cuDNN is not.
            with training_mode(what == "objective"), shapes_only():
                jax.eval_shape(step, params, loader.batch_shapes())
        except RunfileError as error:
            found += error.diagnostics
        except SkippedError:
            pass  # a poisoned name: its definition's error is reported
        except Exception as error:  # noqa: BLE001 - JAX's shape errors, coded
            found.append(
                Diagnostic(
                    "E-SHAPE-007",
                    f"tracing {what} failed: {error}",
                    span,
                    "check the shapes prepare passes to the model",
                )
            )
    return found


def check_passes(result: Evaluated) -> None:
    """Refuse evaluation passes the run cannot schedule (see `pass_errors`).

    Raises:
        RunfileError: every diagnostic `pass_errors` finds.
    """
    raise_found(pass_errors(result))


def pass_errors(result: Evaluated) -> list[Diagnostic]:
    """E-RUN-007 for a pass named `train` (the train split's name) or named
    twice; E-RUN-004 for an `:every` that is not a multiple of defrun's
    `:cadence` (a pass runs where a cadence block ends)."""
    found: list[Diagnostic] = []
    seen: set[str] = set()
    cadence = result.run.cadence
    for name, spec, span in result.evals:
        if name == "train" or name in seen:
            found.append(
                Diagnostic(
                    "E-RUN-007",
                    f"an evaluation pass named `{name}`"
                    + (" twice" if name in seen else ", the train split's name"),
                    span,
                    "give each (defeval NAME ...) a name of its own, other than train",
                )
            )
        seen.add(name)
        if spec.every is not None and spec.every % cadence:
            found.append(
                Diagnostic(
                    "E-RUN-004",
                    f"pass `{name}` runs :every {spec.every} steps, which is not a "
                    f"multiple of defrun's :cadence {cadence}: a pass runs where a "
                    "cadence block ends",
                    span,
                    f"use :every {max(cadence, spec.every // cadence * cadence)}, or "
                    "leave :every out (after every block)",
                )
            )
    return found


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
