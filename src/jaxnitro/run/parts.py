"""`RunParts`: what a handle is made of, behind its facade.

`Nitro` is a facade: its verbs and reads are public, and what they work on is this
value, built once from what setup returned (`RunParts.build`). The run's own modules
(`training`, `records`, `restore`, `evaluation`) take the parts they use from it,
never a private attribute of the handle; the loop gets narrower values still (an
`EpochContext` per epoch, a `RunEvaluation` per handle).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..compile.executables import Executables
from ..loop.prepared import Prepared
from ..observe.transitions import PhaseRecorder
from .config import RunConfig
from .evaluation import RunEvaluation
from .phase import RunPhase
from .release import SplitRelease
from .run_lock import RunLockShare
from .setup_parts import SetupOutcome
from .status import EpochEndHook, RunStatus
from .stops import StopControl
from .values import RunValues


@dataclass(frozen=True)
class RunParts:
    """The parts of one run, each the one writer of what it holds.

    Attributes:
        config: the run's settings, fixed.
        prepared: what setup fixed.
        data: the splits (the handle's `data`, the same dict).
        executables: the handle's compiled programs.
        values: the training state, the live Device values, the weights'
            provenance.
        phase: the phase and the progress line of the entry point running now.
        stops: the stop request, how the last train() ended, a cut epoch.
        status: what training counted (history, step time, profiler).
        lock: the handle's share of the run directory's lock.
        splits: the release of the data sources.
        evaluation: what an evaluation pass reads and writes (`EvalHost`).
        epoch_end_hooks: the `on_epoch_end` hooks, in order.
    """

    config: RunConfig
    prepared: Prepared
    data: dict[str, Any]
    executables: Executables
    values: RunValues
    phase: RunPhase
    stops: StopControl
    status: RunStatus
    lock: RunLockShare
    splits: SplitRelease
    evaluation: RunEvaluation
    epoch_end_hooks: list[EpochEndHook] = field(default_factory=list)

    @classmethod
    def build(cls, outcome: SetupOutcome, recorder: PhaseRecorder) -> RunParts:
        """The parts of a run from what its setup returned; `recorder` publishes
        its phases to the handle's monitors."""
        data = outcome.data
        splits = SplitRelease(data)
        phase = RunPhase(recorder, on_terminal=splits.release)
        executables = Executables(phase)
        values = RunValues(
            outcome.prepared,
            outcome.state,
            outcome.experiment,
            outcome.device_values,
            pending_record=outcome.pending_record,
            checkpoint_source=outcome.checkpoint_source,
            weights_from=outcome.weights_from,
            averaged_from=outcome.averaged_from,
        )
        stops = StopControl()
        return cls(
            config=outcome.config,
            prepared=outcome.prepared,
            data=data,
            executables=executables,
            values=values,
            phase=phase,
            stops=stops,
            status=RunStatus(),
            lock=RunLockShare(outcome.run_lock),
            splits=splits,
            evaluation=RunEvaluation(
                outcome.config,
                outcome.prepared,
                data,
                executables,
                values,
                phase,
                stops,
                outcome.eval_width,
            ),
        )
