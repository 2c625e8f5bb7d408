"""The run-phase tree: where a run is, so a watchdog can tell a compile from a hang.

    Phase
    ├── Starting                 setup of a Nitro
    ├── Compiling                supertype of the four compile phases
    │   ├── GradientCompiling, OptimizerCompiling, EvalCompiling, ExportCompiling
    ├── Stepping
    │   ├── TrainStepping, EvalStepping
    ├── Checkpointing            writing a checkpoint record
    ├── Terminal
    │   ├── Done                 max_epochs reached, early stop, or requested stop
    │   └── Failed               the run raised
    └── Idle                     the caller has control (the spec's `Repl`)

Test a phase with `isinstance(phase, Compiling)` rather than against a leaf class, so a
monitor keeps working when a phase is added. Phases carry no state: two instances of
one class are equal, so `phase == TrainStepping()` works too.

Who publishes what (`observe.transitions`, `observe.entry`): a handle records the
phases from Compiling to Terminal and publishes each change to its monitors; Starting
and Idle describe the process rather than the run, so they are published and never
recorded.
"""

from __future__ import annotations

from typing import ClassVar

from ..errors import NitroError


class Phase:
    """Root of the run-phase tree."""

    def __repr__(self) -> str:
        return type(self).__name__ + "()"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash(type(self).__name__)


class Starting(Phase):
    """Work started and has not yet reached a compile or a step.

    Published when `Nitro(e)` begins setup and when an outermost entry point starts;
    a new handle's phase is Starting until its first transition.
    """


class Compiling(Phase):
    """Supertype of the compile phases, which can take minutes.

    `label` is what the progress display shows: `epoch 1/40: train [compiling
    gradient]`.
    """

    label: ClassVar[str] = "compiling"


class GradientCompiling(Compiling):
    """Tracing and compiling the gradient program."""

    label = "compiling gradient"


class OptimizerCompiling(Compiling):
    """Tracing and compiling the optimizer program."""

    label = "compiling optimizer"


class EvalCompiling(Compiling):
    """Tracing and compiling an evaluation program."""

    label = "compiling eval"


class ExportCompiling(Compiling):
    """Tracing and compiling an export program."""

    label = "compiling export"


class Stepping(Phase):
    """Supertype of the phases that run compiled steps."""


class TrainStepping(Stepping):
    """Running training steps."""


class EvalStepping(Stepping):
    """Running evaluation batches."""


class Checkpointing(Phase):
    """Writing a checkpoint record.

    Recorded and published around each record a `train()` writes (at an epoch's
    end, at a stop, and at the steps `checkpoint_every_n_steps` places inside an
    epoch), which can take seconds for a large model. When the write is done the
    handle goes back to the phase it came from, publishing it again when that was
    TrainStepping: training goes on.
    """


class Terminal(Phase):
    """The run ended."""


class Done(Terminal):
    """The run finished: max_epochs, an early stop, or a requested stop."""


class Failed(Terminal):
    """The run raised."""


class Idle(Phase):
    """No entry point is running: the caller has control.

    Published, never recorded: a handle's `phase` keeps how its run ended (Done or
    Failed). Only the outermost entry point publishes it, so `train()` validating
    each epoch does not announce an idle session mid-run.
    """


COMPILE_PHASES: dict[str, type[Compiling]] = {
    "train_step": GradientCompiling,
    "gradient": GradientCompiling,
    "optimizer": OptimizerCompiling,
    "eval_forward": EvalCompiling,
    "eval_metrics": EvalCompiling,
    "eval_loss": EvalCompiling,
    "export": ExportCompiling,
}


def compile_phase(kind: str) -> Compiling:
    """The compile phase announced while program `kind` compiles.

    Examples:
        >>> compile_phase("gradient")
        GradientCompiling()
    """
    try:
        return COMPILE_PHASES[kind]()
    except KeyError:
        raise NitroError(
            f"No compile phase for program kind {kind!r}: the known kinds are "
            f"{', '.join(sorted(COMPILE_PHASES))}. Add the kind to COMPILE_PHASES in "
            f"jaxnitro/observe/phases.py with the Compiling subclass it announces."
        ) from None
