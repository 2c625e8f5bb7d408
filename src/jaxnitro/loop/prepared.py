"""`Prepared`: what a handle's setup fixed, as one frozen value.

Setup (`run/setup.py`) resolves the run once: the experiment's class and its frozen
hooks, the routing probed from one batch, the split sizes, the optimizer plan and
the stopping policy, the trace context the programs close over, and the run id the
checkpointer writes under. None of it changes afterwards (`set_device` changes the
Device values, which live on the handle; the training state lives in `TrainState`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..compile.programs import GradientFields, TraceContext
from ..data.prefetch import PrefetchConfig
from ..experiment.routing import HookFields
from ..optim.plan import OptimizerPlan


@dataclass(frozen=True)
class Routing:
    """Which batch fields go where, resolved from one probed batch at setup.

    Attributes:
        fields: each routed hook's fields (forward, loss, metrics, train_metrics).
        train_fields: the fields a train batch transfers (what any training hook
            declares); () without a train split.
        gradient_fields: what each traced training hook receives; None without a
            train split.
        train_batch: the train split's batch size; None without a train split.
        sample_shapes: each field's per-sample shape in the first batch seen, to
            explain a shape mismatch later.
        residency: where each metric hook runs, "host" or "device".
        sample_dtypes: each field's dtype in the same batch, by name (a resume
            compares the train fields' with the record's).
    """

    fields: Mapping[str, HookFields]
    train_fields: tuple[str, ...]
    gradient_fields: GradientFields | None
    train_batch: int | None
    sample_shapes: Mapping[str, tuple[int, ...]]
    residency: Mapping[str, str]
    sample_dtypes: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Prepared:
    """What a handle's setup fixed: read by the verbs and the loop, never changed.

    Attributes:
        cls: the experiment class.
        hooks: the hook functions frozen at construction, by name.
        hook_prints: the hooks' code fingerprints then, for the stale-handle check.
        accessor_snapshot: the scalar accessors' values then, for the same check.
        model: the static model object `build_model` returned.
        ctx: what the compiled programs close over (view, hooks, model, keys).
        routing: the batch fields each hook and program receives.
        split_sizes: the batch count of each split, by name.
        derived_keys: the fields `derive` produced (recorded with each checkpoint).
        prefetch: each split's resolved prefetch settings.
        plan: the optimizer plan; None without a train split.
        stopper: the early-stopping policy (a copy bound to the monitor), or None.
        monitor: the watched validation metric and its mode, or None.
        device_schedules: the scheduled Device fields with their dtypes.
        anchor_sums: each decay anchor's checksum, by group.
        restore_best: what `restore_best` loads when training ends (True, an
            Average), or None.
        run_id: the id this run's checkpoints are written under.
        resumed_from_epoch: the epoch a resume started from, or None.
        total_steps: the schedule horizon, max_epochs * (train batches // accum).
        manual: whether `train()` runs the experiment's own `train_step` (manual
            mode), as `manual_training()` said at construction.
        uncut_sizes: in a smoke run, each split's batch count before the run cut
            it to its first batches; None otherwise.
        data_signature: the train data's shape as a record keeps it
            (`run.resume_inputs.data_signature`), or None without a train split.
        unwritable: why `train()` is refused before any work: the setup probe
            could not write the checkpointer's directory of a handle that loads
            weights (built perhaps only to evaluate); None when it can.
    """

    cls: type
    hooks: Mapping[str, Callable[..., Any]]
    hook_prints: Mapping[str, str]
    accessor_snapshot: Mapping[str, Any]
    model: Any
    ctx: TraceContext
    routing: Routing
    split_sizes: Mapping[str, int]
    derived_keys: tuple[str, ...]
    prefetch: Mapping[str, PrefetchConfig]
    plan: OptimizerPlan | None
    stopper: Any
    monitor: tuple[str, str] | None
    device_schedules: tuple[tuple[Any, Any], ...]
    anchor_sums: Mapping[str, str]
    restore_best: Any
    run_id: str | None
    resumed_from_epoch: int | None
    total_steps: int
    manual: bool = False
    uncut_sizes: Mapping[str, int] | None = None
    data_signature: Mapping[str, Any] | None = None
    unwritable: str | None = None
