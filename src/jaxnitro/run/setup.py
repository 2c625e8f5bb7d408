"""The setup sequence a `Nitro` runs at construction, returning what it fixed.

Resolve the run keywords and accessors, freeze the hooks, locate what to resume or
load, seed, build the data (or take `data=`), derive, place the Device fields, probe
one batch for routing and the split checks, build the model, restore weights, build
the optimizer plan, and bind the logger and checkpointer to the run.
"""

from __future__ import annotations

import logging
import random
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from ..checkpoint.checkpointer import Checkpointer
from ..checkpoint.filenames import new_run_id
from ..checkpoint.header import RecordHeader
from ..checkpoint.lock import RunDirLock, lock_checkpoint_dir
from ..checkpoint.lookup import run_label
from ..checkpoint.manifest import read_manifest
from ..checkpoint.record import CheckpointRecord
from ..checkpoint.retention_checks import check_keep, setup_warnings
from ..checkpoint.sources import ResolvedSource
from ..compile.cache import configure_persistent_cache
from ..compile.programs import TraceContext
from ..data.first_batches import first_batches
from ..data.prefetch import auto_prefetch, check_prefetch
from ..data.sources import (
    bind_run_seed,
    check_split,
)
from ..devices.distributed import (
    agree_across_processes,
    distributed_from_environment,
    is_rank0,
    world_size,
)
from ..devices.placement import Placement, check_process_batch_divides, padded_width
from ..errors import (
    ConfigError,
    HookError,
    NitroWarning,
    user_stacklevel,
)
from ..experiment.hooks import (
    RUNTIME_HOOKS,
    check_required_hooks,
    filename_hook,
    freeze_hooks,
    has_hook,
    hook_fingerprints,
    hook_function,
    refuse_hook_fields,
)
from ..experiment.traits import (
    config_metadata,
    device_fields,
    field_names,
    graphconst_fields,
)
from ..experiment.values import to_device
from ..experiment.view import (
    assert_graphconst_hashable,
    check_field_names,
    compile_view,
    graphconst_record,
    graphconst_values,
    replace_fields,
)
from ..logging import protocol as logproto
from ..loop.prepared import Prepared
from ..loop.state import TrainState
from ..observe.progress import Progress
from ..optim.manual import hyperparameters_by_subtree
from ..optim.plan import OptimizerPlan
from ..optim.setup import PlanInputs, anchor_checksums, build_plan
from ..optim.stopping import bind_stopper
from . import restore
from .accessors import (
    SCALAR_ACCESSORS,
    refuse_later_features,
    safe_accessor,
)
from .config import RunConfig
from .derived import convert_derived, derived_from_record
from .resume_inputs import check_resume_flag, check_resumed_inputs, data_signature
from .setup_checks import w0_provider
from .setup_manual import (
    check_manual_config,
    check_manual_plan,
    is_manual,
    manual_hooks,
    manual_opt_states,
)
from .setup_routing import probe_routing
from .smoke import smoke_batches
from .stops import HeldStop
from .write_probe import probe_outputs

log = logging.getLogger("jaxnitro")


@dataclass(frozen=True)
class SetupOutcome:
    """What setup hands the handle: the frozen parts, the first state, the rest.

    Attributes:
        config: the run's settings, resolved and checked.
        prepared: what setup fixed for the verbs and the loop.
        state: the training state to start from (built, restored or resumed).
        held_stop: where a stop cut the resumed epoch, if it did.
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
    held_stop: HeldStop | None
    pending_record: CheckpointRecord | None
    eval_width: int | None
    run_lock: RunDirLock | None
    data: dict[str, Any]
    experiment: Any
    device_values: dict[str, Any]
    checkpoint_source: str | None
    weights_from: dict[str, Any] | None
    averaged_from: dict[str, Any] | None


VAL_EVERY_NEEDS_VAL = (
    "val_every_n_steps={value} needs a val split: it validates on it every {value} "
    "optimizer steps, and this run's data has none. Add a val split, or leave "
    "val_every_n_steps at None."
)


def follow_max_steps(
    config: RunConfig, data: Mapping[str, Any], sizes: Mapping[str, int]
) -> RunConfig:
    """Refuse val_every_n_steps without a val split; give a max_steps run whose
    max_epochs was left at its default the epochs max_steps needs (a ceiling)."""
    trains = "train" in data
    if config.val_every_n_steps is not None and trains and "val" not in data:
        raise ConfigError(VAL_EVERY_NEEDS_VAL.format(value=config.val_every_n_steps))
    per_epoch = config.accumulation.steps(sizes.get("train", 0))
    if config.max_steps is None or not per_epoch:
        return config
    if config.sources["max_epochs"] != "default":
        return config  # set by the user (or a smoke run): it bounds the run too
    needed = -(-config.max_steps // per_epoch)
    return config.with_value("max_epochs", needed, source="max_steps")


class SetupSequence:
    """The construction steps of a `Nitro`: `SetupSequence(keywords, progress)
    .run(experiment)` returns a `SetupOutcome`; the object is then dropped, so what
    it worked with during setup lives on only in the outcome."""

    def __init__(self, keywords: Mapping[str, Any], progress: Progress | None) -> None:
        self._keywords = dict(keywords)
        self._progress = progress
        self._train_state: TrainState | None = None
        self._run_lock: RunDirLock | None = None

    def run(self, e: Any) -> SetupOutcome:
        """Run the setup sequence on the experiment instance `e`."""
        try:
            self._setup(e)
        except BaseException:
            if self._run_lock is not None:  # a refused setup writes nothing
                self._run_lock.release()
            raise
        assert self._train_state is not None
        prepared = Prepared(
            cls=self._cls,
            hooks=self._hooks,
            hook_prints=self._hook_prints,
            accessor_snapshot=self._accessor_snapshot,
            model=self._model,
            ctx=self._ctx,
            routing=self._routing,
            split_sizes=self._split_sizes,
            derived_keys=self._derived_keys,
            prefetch=self._prefetch,
            plan=self._plan,
            stopper=self._stopper,
            monitor=self._monitor,
            device_schedules=tuple(self._device_schedules),
            anchor_sums=self._anchor_sums,
            restore_best=self._restore_best,
            run_id=self._run_id,
            resumed_from_epoch=self._resumed_from_epoch,
            total_steps=self.total_steps,
            manual=self._manual,
            uncut_sizes=self._uncut_sizes,
            data_signature=self._data_signature,
            unwritable=self._unwritable,
        )
        return SetupOutcome(
            config=self._run_config,
            prepared=prepared,
            state=self._train_state.placed(self._placement),
            held_stop=self._epoch_loss,
            pending_record=self._record,
            eval_width=self._eval_width,
            run_lock=self._run_lock,
            data=self.data,
            experiment=self._experiment,
            device_values=self._device_values,
            checkpoint_source=self._checkpoint_source,
            weights_from=self._weights_from,
            averaged_from=self._averaged_from,
        )

    @property
    def total_steps(self) -> int:
        """The schedule horizon: max_epochs * (train batches // accum), or
        max_steps when that comes first."""
        c = self._run_config
        per_epoch = c.accumulation.steps(self._split_sizes.get("train", 0))
        total = c.max_epochs * per_epoch
        return total if c.max_steps is None else min(total, c.max_steps)

    def _setup(self, e: Any) -> None:
        cls = type(e)
        self._cls = cls
        kw = self._keywords
        data_given = "data" in kw
        check_required_hooks(cls, has_data=data_given)
        refuse_hook_fields(e)
        refuse_later_features(e, kw)
        self._check_markers(e)
        assert_graphconst_hashable(e)
        # Join the processes the environment names (nitro launch) before any
        # backend starts; None in a run of one process.
        self._dist = distributed_from_environment()

        # Every run value resolved and checked before any long work.
        self._run_config = RunConfig.resolve(e, kw)
        check_resume_flag(self._run_config)
        if not is_rank0() and self._run_config.logger is not None:
            # Rank 0 logs for the run: the other processes train the same steps.
            self._run_config = self._run_config.with_value(
                "logger", None, source=self._run_config.sources["logger"]
            )
        self._accessor_snapshot = {
            name: safe_accessor(e, name) for name in SCALAR_ACCESSORS
        }
        run_dir = self._run_config.run_dir
        self._logger = self._run_config.logger
        self._checkpointer: Checkpointer | None = self._run_config.checkpointer

        # Manual mode (the experiment's own train_step), read once and frozen.
        self._manual = is_manual(e)
        runtime = [name for name in RUNTIME_HOOKS if has_hook(cls, name)]
        if self._manual:
            check_manual_config(cls, self._run_config)
            runtime = manual_hooks(cls, runtime)
        # Freeze the hooks: this handle keeps running today's code.
        self._hooks = freeze_hooks(cls, runtime)
        self._hook_prints = hook_fingerprints(cls)

        # A resume will write the run it continues: lock its directory first, so
        # two resumes of one run never pick the same record and file names.
        if self._run_config.resume not in (None, False):
            # A read-only directory is not locked: the handle may only evaluate
            # from it, and the write probe refuses train() there.
            self._run_lock = lock_checkpoint_dir(
                self._checkpointer, run_dir, purpose="resume", unwritable_ok=True
            )
        # Locate what to resume or load before anything expensive runs.
        located = restore.locate(self._run_config, run_dir, self._resolve_monitor())
        self._resume: ResolvedSource | None = located.resume
        self._weights: Any = located.weights
        self._record: CheckpointRecord | None = located.record
        self._checkpoint_source = located.checkpoint_source
        self._averaged_from = located.averaged_from
        step = epoch = 0  # where training starts: a resume continues its position
        self._resumed_from_epoch: int | None = None
        # The running train loss of an epoch a stop cut (run/training.py keeps it).
        self._epoch_loss: HeldStop | None = None
        if self._resume is not None and self._record is not None:
            self._adopt_resumed_seed()
            step = self._record.header.step
            epoch = self._record.header.epoch
            self._resumed_from_epoch = epoch
            self._epoch_loss = HeldStop.from_json(self._record.header.epoch_loss)
            recorded_preset = self._record.header.preset
            if self._run_config.preset is None and recorded_preset is not None:
                self._run_config = self._run_config.with_value(
                    "preset", recorded_preset, source="record"
                )

        # Before any hook runs: build_data and build_model's eager ops (a
        # parameter initializer's random draws) hit the cache in a second process.
        configure_persistent_cache()
        seed = self._run_config.seed
        random.seed(seed)
        np.random.seed(seed % 2**32)

        # Data, then derive, on the pre-conversion experiment.
        self._setup_phase("building data")
        data = (
            kw["data"]
            if data_given
            else hook_function(cls, "build_data")(e, self._dist)
        )
        if not isinstance(data, Mapping):
            raise HookError(
                f"build_data must return a dict of splits such as "
                f"{{'train': ..., 'val': ...}}; it returned {type(data).__name__}."
            )
        self.data: dict[str, Any] = dict(data)
        self._uncut_sizes: dict[str, int] | None = None
        if self._run_config.smoke:  # the first batches of each split, checked as cut
            self._uncut_sizes = {
                name: check_split(name, s) for name, s in self.data.items()
            }
            accum = self._run_config.accum
            self.data = {
                name: first_batches(s, smoke_batches(name, accum))
                for name, s in self.data.items()
            }
        bind_run_seed(self.data, seed)  # e.g. an ArraySource shuffles by the run seed
        self._split_sizes = {
            name: check_split(name, s) for name, s in self.data.items()
        }
        self._run_config = follow_max_steps(
            self._run_config, self.data, self._split_sizes
        )

        from_record = (
            self._weights is not None
            and self._record is not None
            and self._record.header.derived is not None
        )
        if from_record:
            assert self._record is not None
            derived = derived_from_record(cls, self._record)
        else:
            derived = hook_function(cls, "derive")(e, self.data) or {}
            if not isinstance(derived, Mapping):
                raise HookError(
                    f"derive must return a dict of field values; it returned "
                    f"{type(derived).__name__}."
                )
            check_field_names(
                cls, derived, "derive returned", "Every key must name a field."
            )
            if self._weights is not None and self._record is not None:
                # An older record holds no list of derived keys: derive runs, and
                # the record's Device values override what it returns.
                stored = self._record.device_values()
                derived = {
                    name: stored.get(name, value)
                    if name in device_fields(cls)
                    else value
                    for name, value in derived.items()
                }
        derived = convert_derived(cls, derived, from_record=from_record)
        self._derived_keys = tuple(derived)
        e = replace_fields(e, **{name: derived[name] for name in derived})
        assert_graphconst_hashable(e)
        if self._record is not None:  # after derive: a derived field compares too
            self._check_record_config(e, self._record)

        # Device conversion: the experiment every later hook sees.
        meta = config_metadata(cls)
        converted = {}
        for name in device_fields(cls):
            declared = meta[name].type if name in meta else None
            converted[name] = to_device(name, declared, getattr(e, name))
        self._experiment = replace_fields(e, **converted)
        self._device_values: dict[str, Any] = converted

        self._routing, self._eval_width = probe_routing(
            self._experiment,
            self._hooks,
            self.data,
            self._split_sizes,
            self._run_config,
        )
        self._data_signature = data_signature(self._split_sizes, self._routing)
        if self._resume is not None and self._record is not None:
            # Before the model is built: a refused resume costs no build.
            check_resumed_inputs(
                self._record.header,
                self._record.path,
                hook_prints=self._hook_prints,
                signature=self._data_signature,
                allow_changed_data=self._run_config.resume_changed_data,
            )
        self._placement = self._mesh()
        # Every split gets its prefetch settings now, after the probe and the checks
        # above saw the collection as build_data returned it.
        self.data = auto_prefetch(self.data)
        self._prefetch = check_prefetch(self.data)

        # The model, on the post-conversion experiment.
        self._setup_phase("building model")
        built = hook_function(cls, "build_model")(
            self._experiment, jax.random.key(seed)
        )
        if not (isinstance(built, tuple) and len(built) == 3):
            raise HookError(
                "build_model must return (model, params, state); it returned "
                f"{type(built).__name__}. Return an empty dict as the state of a "
                "stateless model."
            )
        self._model, params, state = built
        built_state = TrainState.initial(params, state)
        fresh = built_state.params
        restored, self._weights_from = restore.restore_weights(
            built_state,
            self._weights,
            self._record,
            resuming=self._resume is not None,
            load_ema=self._run_config.load_ema,
        )
        self._train_state = restored._replace(step=step, epoch=epoch)
        # Manual mode: the experiment's optimizer states, which its opt schedules
        # bind into, so the plan resolves those against what the states expose.
        manual_states = None
        if self._manual and "train" in self.data:
            manual_states = manual_opt_states(
                self._experiment,
                self._model,
                self._train_state.params,
                self._train_state.model_state,
                None if self._placement is None else self._placement.mesh,
            )
        self._setup_optimization(fresh, self._run_config.w0, manual_states)
        if manual_states is not None and self._plan is not None:
            check_manual_plan(cls, self._plan)
            self._train_state = self._train_state.with_weights(opt_state=manual_states)
        self._restore_best = restore.check_restore_best(self._run_config, self.data)
        restore.check_restore_optimizer(self._run_config, self.data)
        if self._record is not None:
            if self._resume is None and not self._run_config.restore_optimizer:
                self._record = None  # weights only: nothing more to read from it
            else:
                self._record.keep_only("opt_state")  # restored when train() starts

        self._ctx = TraceContext(
            cls=cls,
            view=compile_view(self._experiment),
            device_names=device_fields(cls),
            hooks=self._hooks,
            model=self._model,
            graphconst=graphconst_values(self._experiment),
            compile_options=dict(self._run_config.compile_options),
            precision=self._run_config.precision,
            placement=self._placement,
        )
        self._bind_run(run_dir)
        # The output directories can be written: found now, not after an epoch.
        self._unwritable = probe_outputs(
            self._checkpointer,
            self._logger,
            trains="train" in self.data,
            loads=self._record is not None or self._weights is not None,
        )
        self._log_resume()

    def _mesh(self) -> Placement | None:
        """The run's mesh (None for one device), once the probe knows the batch:
        the global train batch must split evenly, and the eval width is rounded up
        so a padded eval batch does too."""
        n_devs = self._run_config.n_devs
        world = world_size(self._dist)
        if n_devs == 1 and world == 1:
            return None
        if self._routing.train_batch is not None:
            check_process_batch_divides(self._routing.train_batch, n_devs, world)
        if world > 1:  # a process feeding less than the others would hang them
            agree_across_processes(
                {
                    "train batches": self._split_sizes.get("train", 0),
                    "samples per train batch": self._routing.train_batch or 0,
                    # Each process pads its eval chunks to its part of one width.
                    "samples in the first eval batch": self._eval_width or 0,
                    **{
                        f"{name} batches": size
                        for name, size in self._split_sizes.items()
                        if name != "train"
                    },
                }
            )
        if self._eval_width is not None:  # each process pads its part of the width
            self._eval_width = padded_width(self._eval_width, n_devs) * world
        return Placement.build(n_devs=n_devs, mode=self._run_config.sharding)

    def _setup_phase(self, label: str) -> None:
        if self._progress is not None:
            self._progress.phase(label)

    def _check_markers(self, e: Any) -> None:
        graphconst = set(graphconst_fields(type(e)))
        for name, fix in (("seed", "a seed sweep"), ("max_epochs", "a longer run")):
            if name in graphconst and name in field_names(type(e)):
                raise ConfigError(
                    f"Field `{name}` of {type(e).__name__} is marked GraphConst, which "
                    f"would bake it into the compiled graph and recompile for "
                    f"{fix}. It is read on the host only: mark it Host (or leave it "
                    f"unmarked)."
                )

    def _check_record_config(self, e: Any, record: CheckpointRecord) -> None:
        stored = record.header.graphconst
        current = graphconst_record(e)
        diff = {
            name: (stored.get(name), current.get(name))
            for name in set(stored) | set(current)
            if stored.get(name) != current.get(name)
        }
        if not diff:
            return
        shown = "; ".join(
            f"{n}: {a!r} in the record, {b!r} now" for n, (a, b) in diff.items()
        )
        if self._resume is not None:
            raise ConfigError(
                f"Cannot resume from {record.path}: its GraphConst fields differ from "
                f"this experiment's ({shown}), so it trained a different program. "
                f"Resume with the recorded values, or start from its weights with "
                f"weights=."
            )
        warnings.warn(
            f"weights={record.path} was written with other GraphConst values "
            f"({shown}); "
            f"the parameters are loaded into this experiment's program.",
            NitroWarning,
            stacklevel=user_stacklevel(),
        )

    def _adopt_resumed_seed(self) -> None:
        assert self._record is not None
        recorded = self._record.header.seed
        passed = self._run_config.seed
        if recorded != passed:
            warnings.warn(
                f"Resuming {self._record.path} with its recorded seed {recorded}; the "
                f"seed given here ({passed}) is ignored, since a resume continues the "
                f"run it names.",
                NitroWarning,
                stacklevel=user_stacklevel(),
            )
        self._run_config = self._run_config.with_value(
            "seed", recorded, source="record"
        )

    def _resolve_monitor(self) -> tuple[str, str] | None:
        """The monitor, defaulting to ("loss", "min") when the loss is sure to exist."""
        monitor = self._run_config.monitor
        if monitor is None and (
            "metrics" not in self._hooks or self._run_config.eval_loss
        ):
            monitor = ("loss", "min")
            self._run_config = self._run_config.with_value(
                "monitor", monitor, source="default"
            )
        return monitor

    def _setup_optimization(
        self, fresh: Any, w0_option: Any, manual_states: Any = None
    ) -> None:
        """The optimizer plan and the early-stopping policy; `manual_states`: a
        manual run's optimizer states, whose exposed hyperparameters its opt
        schedules bind to."""
        monitor = self._resolve_monitor()
        c = self._run_config
        self._plan: OptimizerPlan | None = None
        self._stopper: Any = None
        self._anchor_sums: dict[str, str] = {}
        self._device_schedules: list[tuple[Any, Any]] = []
        if "train" not in self.data:
            return  # nothing to optimize: no plan, no optimizer state
        has_val = "val" in self.data
        policy = c.early_stop
        if policy is not None and not has_val:
            raise ConfigError(
                "early_stop needs a val split: it is checked once per epoch after "
                "validation, and this run has none."
            )
        self._stopper = bind_stopper(policy, monitor)
        self._check_control_metric(
            getattr(self._stopper, "metric", None), "EarlyStopping"
        )
        assert self._train_state is not None  # built with the model, just before
        params = self._train_state.params
        self._plan = build_plan(
            self._experiment,
            params,
            w0_provider(
                w0_option,
                fresh,
                params,
                self._weights is not None,
                resuming=self._resume is not None,
            ),
            PlanInputs(
                schedules=c.schedules,
                clip_norm=float(c.gradient_clip_norm),
                ema=c.ema,
                total=self.total_steps,
                monitor=monitor,
                device_fields=device_fields(self._cls),
                manual_fields=None
                if manual_states is None
                else hyperparameters_by_subtree(manual_states),
            ),
        )
        for schedule in self._plan.schedules:
            if schedule.plateau is not None:
                if not has_val:
                    raise ConfigError(
                        f"The Plateau on schedule `{schedule.key}` needs a val split: "
                        f"it is updated once per epoch from validation."
                    )
                self._check_control_metric(schedule.plateau.metric, "Plateau")
        self._anchor_sums = anchor_checksums(self._plan)
        self._device_schedules = [
            (s.target, self._device_values[s.target.name].dtype)
            for s in self._plan.schedules
            if s.target.namespace == "device"
        ]
        if self._resume is not None and self._record is not None:
            self._restore_counters(self._record.header)

    def _check_control_metric(self, metric: str | None, what: str) -> None:
        """Without custom metrics the only validation metric is the loss."""
        if metric is not None and "metrics" not in self._hooks and metric != "loss":
            raise ConfigError(
                f"{what} watches `{metric}`, but {self._cls.__name__} defines no "
                f'metrics, so validation reports only `loss`. Watch "loss", or '
                f"define metrics()."
            )

    def _restore_counters(self, header: RecordHeader) -> None:
        """A resume continues the early-stopping and Plateau counters, and verifies
        that every decay anchor is the one the record trained toward."""
        assert self._plan is not None
        stored = header.anchor_checksums or {}
        for group, checksum in self._anchor_sums.items():
            if group in stored and stored[group] != checksum:
                raise ConfigError(
                    f"Cannot resume from {self._record.path if self._record else ''}: "
                    f"group {group!r} decays toward an anchor that differs from the "
                    f"one the record trained toward (checksum mismatch). An anchored "
                    f"run resumes only when its anchor is rebuilt identically: the "
                    f'same decay_anchor, and for an anchor of "w0" the same w0. The '
                    f"default w0 is what build_model returns for the recorded seed; "
                    f'a run trained with w0="weights" (L2-SP) or w0=<tree> resumes '
                    f"with that tree passed as w0=<tree>, e.g. w0=Nitro(e, "
                    f"weights=<its source>, logger=None, checkpointer=None)"
                    f".parameters."
                )
        if self._stopper is not None and header.early_stop:
            restore = getattr(self._stopper, "restore", None)
            if callable(restore):
                restore(header.early_stop)
        plateaus = header.plateau
        for schedule in self._plan.schedules:
            if schedule.plateau is not None and schedule.key in plateaus:
                schedule.plateau.restore(plateaus[schedule.key])

    def _bind_run(self, run_dir: str) -> None:
        """Point the logger and checkpointer at the run; log params and bindings."""
        monitor = self._resolve_monitor()
        self._monitor = monitor
        ckpt = self._checkpointer
        has_val = "val" in self.data
        trains = "train" in self.data
        parent = None  # the record a resume branches from into a new run
        if ckpt is not None:
            if ckpt.ranks and monitor is None and ckpt.metric is None and has_val:
                raise ConfigError(
                    f"The checkpointer keeps Best checkpoints but {self._cls.__name__} "
                    f"defines its own metrics and no `monitor`, so there is nothing to "
                    f"rank by. Define monitor() returning e.g. ('acc', 'max'), pass "
                    f"monitor=, or keep only the latest: "
                    f"checkpointer=Checkpointer(keep=Last(1))."
                )
            check_keep(ckpt, trains=trains, has_val=has_val)
            resume = self._resume
            if resume is not None and resume.entry is not None and resume.is_run_newest:
                # The newest record of a run continues that run (a legacy run: None).
                run_id = resume.entry.run
            else:
                run_id = new_run_id()
                parent = resume.path if resume is not None else None
            self._run_id: str | None = run_id
            ckpt.bind(
                directory=run_dir,
                monitor=monitor,
                run=run_id,
                parent=parent,
                filename=filename_hook(self._experiment),
            )
            if trains and ckpt.dir is not None:
                # Quietly: a lost manifest, rebuilt, is written at the first save.
                entries = read_manifest(ckpt.dir, warn=False)
                for text in setup_warnings(ckpt, entries, trains=True):
                    warnings.warn(text, NitroWarning, stacklevel=user_stacklevel())
        else:
            self._run_id = new_run_id()
        bind = getattr(self._logger, "bind_run_dir", None)
        if callable(bind):
            bind(run_dir)
        bind_id = getattr(self._logger, "bind_run_id", None)
        if callable(bind_id):  # every line it writes carries the run's id
            bind_id(self._run_id)
        if self._resume is not None and self._record is not None:
            state = self._record.header.logger_state
            if state is not None and self._logger is not None:
                recorded_type = self._record.header.logger_type
                mine = type(self._logger)
                if recorded_type not in (
                    None,
                    f"{mine.__module__}.{mine.__qualname__}",
                ):
                    raise ConfigError(
                        f"Cannot resume into a {type(self._logger).__name__}: the "
                        f"record was logged by a {recorded_type}. Pass a logger of "
                        f"that type."
                    )
                logproto.reattach(self._logger, state)
        self._branch_parent = parent

    def _log_resume(self) -> None:
        """Write what a resume continues, once the probe found the log writable."""
        if self._resume is not None and self._branch_parent is not None:
            self._log_branch(self._resume, str(self._run_id))
        if self._resume is not None and self._record is not None:
            # Lines a crash left past this step are trained again after this line.
            logproto.log_resume(
                self._logger,
                step=self._record.header.step,
                epoch=self._record.header.epoch,
                run_id=self._run_id,
                source=self._record.path,
            )

    def _log_branch(self, resume: ResolvedSource, run_id: str) -> None:
        """Say that resuming `resume` starts a new run rather than continuing one."""
        entry = resume.entry
        if entry is None:
            what = "is not listed in the run directory's manifest"
        else:
            run = run_label(entry.run)
            what = f"is epoch {entry.epoch} of run {run}, not its newest record"
        log.info(
            "resume: %s %s, so this is a new run %s that branches from it; the "
            "original run's later epochs are kept.",
            resume.path,
            what,
            run_id,
        )
        logproto.log_other(self._logger, "branched_from", resume.path)

    # ------------------------------------------------------------ public reads ------
