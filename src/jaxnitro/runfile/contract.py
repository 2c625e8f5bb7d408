"""The contract: the conventional names a run file must (or may) define.

Each component is checked on its own and every error is reported in one
`RunfileError`, so a mistake in `objective` never hides a missing `optimizer`.
Names are looked up among the file's own definitions, never in a library.
"""

from __future__ import annotations

from typing import Any

from .evaluator import Evaluated
from .nn_models import ModelSpec
from .source import Diagnostic, RunfileError
from .stdlib_data import LoaderSpec
from .stdlib_optim import OptimizerSpec
from .values import Builtin, Closure, Poisoned, kind_of

FUNCTIONS = {
    "prepare": 1,
    "eval-prepare": 1,
    "objective": 2,
    "evaluate": 2,
    "curriculum": 3,
}
"""The contract's functions and how many arguments each takes."""

VALUES: dict[str, tuple[type, str]] = {
    "train-loader": (LoaderSpec, "a loader, (loader ...)"),
    "model": (ModelSpec, "a model, such as (gpt ...)"),
    "optimizer": (OptimizerSpec, "an optimizer, such as (sgd ...) or (adamw ...)"),
}
REQUIRED = ("train-loader", "prepare", "model", "objective", "optimizer")
EXAMPLES = {
    "train-loader": "(defvar train-loader (loader :sources [...] :fields [...] "
    ":batch-size 4))",
    "prepare": "(defun prepare (batch) (list :inputs ... :targets ...))",
    "model": "(defvar model (gpt :vocab 32 :layers 2 :dim 32 :heads 2))",
    "objective": "(defun objective (prediction targets) (cross-entropy prediction "
    "targets))",
    "optimizer": "(defvar optimizer (sgd :lr 0.5))",
    "evaluate": "(defun evaluate (prediction targets) (list :loss ...))",
    "defrun": "(defrun :steps 20 :microbatches 2 :precision :f32 :seed 1)",
}


def _wanted(name: str) -> str:
    if name in FUNCTIONS:
        count = FUNCTIONS[name]
        return f"a function of {count} argument{'s' if count != 1 else ''}"
    return VALUES[name][1]


def fits(name: str, value: Any) -> bool:
    """Whether `value` is what the contract's `name` must be bound to."""
    if name in FUNCTIONS:
        if isinstance(value, Closure):
            return len(value.params) == FUNCTIONS[name]
        return isinstance(value, Builtin)
    return isinstance(value, VALUES[name][0])


def contract_errors(result: Evaluated) -> list[Diagnostic]:
    """Every contract diagnostic of an evaluated file (empty when it holds)."""
    found: list[Diagnostic] = []
    file_span = None
    for name in (*REQUIRED, "eval-prepare", "evaluate", "curriculum"):
        if name not in result.defined:
            needed = name in REQUIRED or (name == "evaluate" and result.evals)
            if needed:
                why = " (the file has an evaluation pass)" if name == "evaluate" else ""
                found.append(
                    Diagnostic(
                        "E-CONTRACT-001",
                        f"{result.path}: missing `{name}`{why}",
                        file_span,
                        f"define it: {EXAMPLES[name]}",
                    )
                )
            continue
        value = result.value(name)
        if isinstance(value, Poisoned):
            continue  # its definition failed, and that error is reported
        if not fits(name, value):
            found.append(
                Diagnostic(
                    "E-CONTRACT-002",
                    f"`{name}` is {kind_of(value)}; the contract wants {_wanted(name)}",
                    result.defined[name],
                    f"bind `{name}` to {_wanted(name)}",
                )
            )
    if result.run is None:
        found.append(
            Diagnostic(
                "E-CONTRACT-001",
                f"{result.path}: missing (defrun ...)",
                None,
                f"add {EXAMPLES['defrun']}",
            )
        )
    return found


def check_contract(result: Evaluated) -> None:
    """Raise every contract diagnostic at once (`RunfileError`), if any."""
    found = contract_errors(result)
    if found:
        raise RunfileError(found)
