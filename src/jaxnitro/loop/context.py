"""What the loop reads of a run: `EpochContext` for one training epoch, `EvalHost`
for an evaluation pass.

The epoch loop (`steps.py`, `calls.py`, `epoch_log.py`, `step_programs.py`) takes
this value and the training state instead of the handle: the run's settings it
reads, the prepared programs and routing, the train split, the logger and progress
bar, the stop control, and two narrow doors back to the state's owner (`current`
reads the state it holds, `commit` hands it a new one). `run/training.py` builds
one per epoch from the handle (`steps_per_call` is resolved per epoch: "auto"
measures the first one).

An evaluation pass (`evaluate.py`) runs inside a verb of the handle and changes a
little of the run (the phase, the eval width it fixes, a stop request a stop on the
progress line makes): it takes an `EvalHost`, the narrow protocol of what it reads
and writes, which `run/evaluation.py` builds from the handle's parts.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..compile.executables import Executables
from ..observe import phases
from ..observe.profiling import StepProfiler
from .host_buffers import HostBuffers
from .prepared import Prepared
from .state import TrainState


class StopControl(Protocol):
    """Where the loop reads whether to stop: the handle's own request (its
    `RunStatus`), or across processes the stop every rank agreed on."""

    @property
    def stop_requested(self) -> bool: ...

    @property
    def preempted(self) -> bool: ...


class AheadHolder(Protocol):
    """Where an epoch leaves the next one's first block, read while it ends, and
    where the next epoch finds it (`read_ahead.ReadAhead`)."""

    def put(self, ahead: Any) -> None: ...

    def take(self, epoch: int, source: Any, settings: Any) -> Any: ...


@dataclass(frozen=True)
class EpochContext:
    """What one training epoch reads.

    Attributes:
        accum: micro-batches per optimizer step.
        seed: the run seed (the step rng folds it in).
        steps_per_call: optimizer steps per dispatch this epoch ("auto" resolved).
        log_every_n_steps: the train line's cadence.
        autolog_schedules: the train line carries the schedule values.
        check_divergence: a non-finite loss raises.
        max_epochs: for the progress bar's epoch count.
        prepared: the programs' trace context, the optimizer plan, the routing.
        executables: the handle's compiled programs (its memo of the cache).
        experiment: the live experiment (host train_metrics are called on it).
        source: the train split.
        logger: the run's logger, or None.
        bar: the progress bar, or None.
        stops: the stop control the loop checks at call boundaries.
        profiler: the `profile=` trace of chosen steps, or None.
        device_values: the Device fields now (`set_device` may replace them).
        current: the training state its owner holds now.
        commit: hand the owner a new training state (on every exit of the loop,
            a raising one included: the old state's buffers were donated).
        programs: the train programs this `train()` found, by what their calls
            take: a later epoch's first call finds its program here
            (`step_programs.call_program`) instead of keying it again, which
            cost a short epoch about 80 us on a CPU host; one dict per
            `train()`, so the optimizer's constants a program was declared from
            are checked again at each `train()`.
        read_ahead: where an epoch leaves the next one's first block, read while
            it ends (`read_ahead.py`); None: each epoch reads its own (the run
            decides, `run/training.py`).
        host_buffers: the buffers this `train()` stacks its blocks into, reused
            once free (`host_buffers.py`); None: each block is stacked into
            fresh memory.
    """

    accum: int
    seed: int
    steps_per_call: int
    log_every_n_steps: int
    autolog_schedules: bool
    check_divergence: bool
    max_epochs: int
    prepared: Prepared
    executables: Executables
    experiment: Any
    source: Any
    logger: Any
    bar: Any
    stops: StopControl
    profiler: StepProfiler | None
    device_values: Callable[[], dict[str, Any]]
    current: Callable[[], TrainState]
    commit: Callable[[TrainState], None]
    programs: dict[Hashable, Any] = field(default_factory=dict)
    read_ahead: AheadHolder | None = None
    host_buffers: HostBuffers | None = None


class EvalSettings(Protocol):
    """The run settings an evaluation pass reads (`RunConfig` has them)."""

    @property
    def eval_loss(self) -> bool: ...

    @property
    def n_devs(self) -> int: ...

    @property
    def max_epochs(self) -> int: ...


class EvalStops(Protocol):
    """The stop an evaluation pass reads between source batches and requests when
    a stop comes from its progress line (`run.stops.StopControl` is one)."""

    @property
    def stop_requested(self) -> bool: ...

    def request(self) -> None: ...


class EvalHost(Protocol):
    """What an evaluation pass (`evaluate.py`) reads and writes of the run it
    serves: the settings, the prepared programs and the data, the weights it
    evaluates, its phase and progress line, its stop and the eval programs' batch
    width (fixed by setup's probe, else by the first pass; then it stays).
    `run/evaluation.py` builds one per handle from the handle's parts."""

    @property
    def config(self) -> EvalSettings: ...

    @property
    def prepared(self) -> Prepared: ...

    @property
    def stops(self) -> EvalStops: ...

    @property
    def experiment(self) -> Any: ...

    @property
    def states(self) -> Any: ...

    @property
    def current_epoch(self) -> int: ...

    @property
    def phase(self) -> phases.Phase: ...

    data: dict[str, Any]
    executables: Executables
    eval_width: int | None

    def device_values(self) -> dict[str, Any]: ...

    def eval_params(self) -> Any: ...

    def set_phase(self, phase: phases.Phase, **info: Any) -> None: ...

    def restore_phase(self, phase: phases.Phase, **info: Any) -> None: ...

    def progress(self) -> Any: ...
