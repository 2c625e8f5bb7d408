"""The run-phase tree: where a run is, so a watchdog can tell a compile from a hang.

    Phase
    ├── Starting                 setup of a Nitro
    ├── Compiling                supertype of the four compile phases
    │   ├── GradientCompiling, OptimizerCompiling, EvalCompiling, ExportCompiling
    ├── Stepping
    │   ├── TrainStepping, EvalStepping
    ├── Terminal
    │   ├── Done                 max_epochs reached, early stop, or requested stop
    │   └── Failed               the run raised
    └── Idle                     the caller has control

Test a phase with `isinstance(phase, Compiling)` rather than against a leaf class, so a
monitor keeps working when a phase is added.
"""

from __future__ import annotations


class Phase:
    """Root of the run-phase tree."""

    def __repr__(self) -> str:
        return type(self).__name__ + "()"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash(type(self).__name__)


class Starting(Phase):
    """A Nitro is being set up."""


class Compiling(Phase):
    """Supertype of the compile phases, which can take minutes."""


class GradientCompiling(Compiling):
    """Tracing and compiling the gradient program."""


class OptimizerCompiling(Compiling):
    """Tracing and compiling the optimizer program."""


class EvalCompiling(Compiling):
    """Tracing and compiling an evaluation program."""


class ExportCompiling(Compiling):
    """Tracing and compiling an export program."""


class Stepping(Phase):
    """Supertype of the phases that run compiled steps."""


class TrainStepping(Stepping):
    """Running training steps."""


class EvalStepping(Stepping):
    """Running evaluation batches."""


class Terminal(Phase):
    """The run ended."""


class Done(Terminal):
    """The run finished: max_epochs, an early stop, or a requested stop."""


class Failed(Terminal):
    """The run raised."""


class Idle(Phase):
    """No entry point is running: the caller has control."""


COMPILE_PHASES: dict[str, type[Compiling]] = {
    "train_step": GradientCompiling,
    "gradient": GradientCompiling,
    "optimizer": OptimizerCompiling,
    "eval_forward": EvalCompiling,
    "eval_metrics": EvalCompiling,
    "eval_loss": EvalCompiling,
    "export": ExportCompiling,
}
