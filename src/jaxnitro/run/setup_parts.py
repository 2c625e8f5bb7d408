"""The typed parts the setup stages return (`run/setup.py`), in the order they run.

Each stage takes what the earlier ones returned and returns one frozen part; a stage
that changes the run's settings (a resume adopts the recorded seed, max_steps sets
max_epochs) returns the new `RunConfig` in its part, and the later stages read that
one. `SetupOutcome` is what the handle keeps of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..checkpoint.lock import RunDirLock
from ..checkpoint.record import CheckpointRecord
from ..compile.programs import TraceContext
from ..devices.placement import Placement
from ..loop.prepared import Prepared, Routing
from ..loop.state import HeldStop, TrainState
from ..optim.plan import OptimizerPlan
from .config import RunConfig
from .restore import Located
from .run_binding import RunBinding


@dataclass(frozen=True)
class Resolved:
    """The settings and the frozen hooks (`resolve_settings`).

    Attributes:
        cls: the experiment's class.
        config: every run value resolved and checked, the monitor's default filled.
        dist: the `jax.distributed` processes joined, or None for one process.
        accessor_snapshot: each scalar accessor's value now (the stale check).
        manual: the experiment trains with its own `train_step`.
        hooks: the hooks this handle keeps running, frozen.
        hook_prints: their code fingerprints.
    """

    cls: type
    config: RunConfig
    dist: Any
    accessor_snapshot: dict[str, Any]
    manual: bool
    hooks: dict[str, Any]
    hook_prints: dict[str, str]


@dataclass(frozen=True)
class Position:
    """What `resume=` and `weights=` name, and where training starts (`locate_run`).

    Attributes:
        config: the settings, with a resume's recorded seed and preset adopted.
        located: the resume and weights sources and the record they load.
        step: the optimizer step training starts from (a resume's).
        epoch: the epoch training starts from (a resume's).
        held_stop: where a stop cut the resumed epoch, if it did.
        run_lock: the run directory's lock a resume takes, if one.
    """

    config: RunConfig
    located: Located
    step: int
    epoch: int
    held_stop: HeldStop | None
    run_lock: RunDirLock | None

    @property
    def resuming(self) -> bool:
        """A resume continues a record."""
        return self.located.resume is not None and self.located.record is not None

    @property
    def resumed_from_epoch(self) -> int | None:
        """The epoch a resume continues from, None otherwise."""
        return self.epoch if self.resuming else None


@dataclass(frozen=True)
class Splits:
    """The data as `build_data` (or `data=`) gave it (`build_splits`).

    Attributes:
        config: the settings, max_epochs following max_steps where it was left.
        data: the splits (a smoke run's cut to their first batches).
        sizes: each split's batch count.
        uncut_sizes: a smoke run's batch counts before the cut, else None.
    """

    config: RunConfig
    data: dict[str, Any]
    sizes: dict[str, int]
    uncut_sizes: dict[str, int] | None


@dataclass(frozen=True)
class Converted:
    """The experiment every later hook sees (`derive_and_convert`).

    Attributes:
        experiment: after derive, its Device fields placed on the device.
        device_values: those Device fields, as the dict every program receives.
        derived_keys: the fields derive (or the record) produced.
    """

    experiment: Any
    device_values: dict[str, Any]
    derived_keys: tuple[str, ...]


@dataclass(frozen=True)
class Routed:
    """What one probed batch fixed, the mesh and the prefetch (`route_splits`).

    Attributes:
        routing: the routed fields, shapes and residencies.
        eval_width: the eval programs' batch width, if the probe fixed it.
        data_signature: what a resume compares of the train data.
        placement: the run's mesh, None on one device.
        data: the splits, each with its prefetch settings.
        prefetch: the resolved prefetch settings per split.
    """

    routing: Routing
    eval_width: int | None
    data_signature: Any
    placement: Placement | None
    data: dict[str, Any]
    prefetch: dict[str, Any]


@dataclass(frozen=True)
class Built:
    """The model and the weights training starts from (`build_weights`).

    Attributes:
        model: what `build_model` returned as the model.
        state: the training state (built, restored or resumed, at its position).
        fresh: the parameters `build_model` returned (`w0`'s default).
        weights_from: what a live handle given as weights= was, if one.
    """

    model: Any
    state: TrainState
    fresh: Any
    weights_from: dict[str, Any] | None


@dataclass(frozen=True)
class Optimization:
    """The optimizer plan and the policies (`plan_optimization`).

    Attributes:
        plan: the optimizer plan, None without a train split.
        stopper: the early-stopping policy, or None.
        anchor_sums: each decay anchor's checksum.
        device_schedules: each scheduled Device field's target and dtype.
        restore_best: the `restore_best` choice, checked.
        state: the training state (a manual run's optimizer states placed).
        pending_record: the record whose optimizer state `train()` restores.
    """

    plan: OptimizerPlan | None
    stopper: Any
    anchor_sums: dict[str, str]
    device_schedules: tuple[tuple[Any, Any], ...]
    restore_best: Any
    state: TrainState
    pending_record: CheckpointRecord | None


@dataclass(frozen=True)
class Bound:
    """The programs' trace context and the outputs bound to the run
    (`bind_outputs`).

    Attributes:
        ctx: what every program of the run traces with.
        binding: the run's id, and a resume's branch parent.
        unwritable: why an output directory cannot be written, or None.
    """

    ctx: TraceContext
    binding: RunBinding
    unwritable: str | None


@dataclass(frozen=True)
class SetupOutcome:
    """What setup hands the handle: the frozen parts, the first state, the rest.

    Attributes:
        config: the run's settings, resolved and checked.
        prepared: what setup fixed for the verbs and the loop.
        state: the training state to start from (built, restored or resumed).
        pending_record: the record whose optimizer state `train()` restores.
        eval_width: the eval batch width the probe fixed, if it could.
        run_lock: the run directory's lock a resume took, if one.
        data: the splits, each with its prefetch settings.
        experiment: the experiment after derive and the Device conversion.
        device_values: its Device fields, as the dict every program receives.
        checkpoint_source: the record file the weights come from, if one.
        weights_from: what a live handle given as weights= was, if one.
        averaged_from: what an averaged weights source averaged, if one.
    """

    config: RunConfig
    prepared: Prepared
    state: TrainState
    pending_record: CheckpointRecord | None
    eval_width: int | None
    run_lock: RunDirLock | None
    data: dict[str, Any]
    experiment: Any
    device_values: dict[str, Any]
    checkpoint_source: str | None
    weights_from: dict[str, Any] | None
    averaged_from: dict[str, Any] | None
