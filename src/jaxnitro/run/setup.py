"""The setup sequence a `Nitro` runs at construction: staged functions, each
returning a typed part (`run/setup_parts.py`).

`run_setup` runs them in order: resolve the run keywords and accessors and freeze
the hooks (`resolve_settings`), locate what to resume or load (`locate_run`), seed
and build the data (`build_splits`), derive and place the Device fields
(`derive_and_convert`), probe one batch for routing, the mesh and the prefetch
(`route_splits`), build the model and restore weights (`build_weights`), build the
optimizer plan and the policies (`plan_optimization`), then bind the logger and
checkpointer to the run (`run_binding.bind_run`) and probe that the outputs can be
written. Nothing is compiled and no optimizer state is allocated.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from ..checkpoint.lock import lock_checkpoint_dir
from ..compile.cache import configure_persistent_cache
from ..compile.programs import TraceContext
from ..data.first_batches import first_batches
from ..data.prefetch import auto_prefetch, check_prefetch
from ..data.sources import bind_run_seed, check_split
from ..devices.distributed import distributed_from_environment, is_rank0
from ..errors import ConfigError, HookError
from ..experiment.hooks import (
    RUNTIME_HOOKS,
    check_required_hooks,
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
    graphconst_values,
    replace_fields,
)
from ..loop.prepared import Prepared
from ..loop.state import HeldStop, TrainState
from ..observe.progress import Progress
from ..optim.manual import hyperparameters_by_subtree
from ..optim.setup import PlanInputs, anchor_checksums, build_plan
from ..optim.stopping import bind_stopper
from . import restore
from .accessors import SCALAR_ACCESSORS, refuse_later_features, safe_accessor
from .config import RunConfig
from .derived import convert_derived, derived_from_record
from .resume_inputs import (
    adopt_resumed_seed,
    check_record_config,
    check_resume_flag,
    check_resumed_inputs,
    data_signature,
    restore_counters,
)
from .run_binding import bind_run, log_resume
from .setup_checks import w0_provider
from .setup_manual import (
    check_manual_config,
    check_manual_plan,
    is_manual,
    manual_hooks,
    manual_opt_states,
)
from .setup_parts import (
    Bound,
    Built,
    Converted,
    Optimization,
    Position,
    Resolved,
    Routed,
    SetupOutcome,
    Splits,
)
from .setup_routing import probe_routing, run_mesh
from .smoke import smoke_batches
from .write_probe import probe_outputs

VAL_EVERY_NEEDS_VAL = (
    "val_every_n_steps={value} needs a val split: it validates on it every {value} "
    "optimizer steps, and this run's data has none. Add a val split, or leave "
    "val_every_n_steps at None."
)
MARKED_GRAPHCONST = (
    "Field `{name}` of {cls} is marked GraphConst, which would bake it into the "
    "compiled graph and recompile for {fix}. It is read on the host only: mark it "
    "Host (or leave it unmarked)."
)


def run_setup(
    e: Any, keywords: Mapping[str, Any], progress: Progress | None
) -> SetupOutcome:
    """Run the setup sequence on the experiment instance `e` with the run
    `keywords`; `progress` shows its phases. A refused setup writes nothing: the
    lock a resume took is released."""
    resolved = resolve_settings(e, keywords)
    position = locate_run(resolved)
    try:
        return _from_position(e, keywords, progress, resolved, position)
    except BaseException:
        if position.run_lock is not None:
            position.run_lock.release()
        raise


def _from_position(
    e: Any,
    keywords: Mapping[str, Any],
    progress: Progress | None,
    resolved: Resolved,
    position: Position,
) -> SetupOutcome:
    """The stages after the run's position is known, and the outcome."""
    # Before any hook runs: build_data and build_model's eager ops (a parameter
    # initializer's random draws) hit the cache in a second process.
    configure_persistent_cache()
    seed = position.config.seed
    random.seed(seed)
    np.random.seed(seed % 2**32)
    if progress is not None:
        progress.phase("building data")
    splits = build_splits(e, keywords, resolved, position)
    converted = derive_and_convert(e, resolved, position, splits)
    routed = route_splits(resolved, position, splits, converted)
    if progress is not None:
        progress.phase("building model")
    built = build_weights(resolved, position, converted)
    optimization = plan_optimization(
        resolved, position, splits, converted, routed, built
    )
    config, located = splits.config, position.located
    bound = bind_outputs(resolved, position, splits, converted, routed, built)
    prepared = Prepared(
        cls=resolved.cls,
        hooks=resolved.hooks,
        hook_prints=resolved.hook_prints,
        accessor_snapshot=resolved.accessor_snapshot,
        model=built.model,
        ctx=bound.ctx,
        routing=routed.routing,
        split_sizes=splits.sizes,
        derived_keys=converted.derived_keys,
        prefetch=routed.prefetch,
        plan=optimization.plan,
        stopper=optimization.stopper,
        monitor=config.monitor,
        device_schedules=optimization.device_schedules,
        anchor_sums=optimization.anchor_sums,
        restore_best=optimization.restore_best,
        run_id=bound.binding.run_id,
        resumed_from_epoch=position.resumed_from_epoch,
        total_steps=total_steps(config, splits.sizes),
        manual=resolved.manual,
        uncut_sizes=splits.uncut_sizes,
        data_signature=routed.data_signature,
        unwritable=bound.unwritable,
    )
    return SetupOutcome(
        config=config,
        prepared=prepared,
        state=optimization.state.placed(routed.placement),
        pending_record=optimization.pending_record,
        eval_width=routed.eval_width,
        run_lock=position.run_lock,
        data=routed.data,
        experiment=converted.experiment,
        device_values=converted.device_values,
        checkpoint_source=located.checkpoint_source,
        weights_from=built.weights_from,
        averaged_from=located.averaged_from,
    )


def bind_outputs(
    resolved: Resolved,
    position: Position,
    splits: Splits,
    converted: Converted,
    routed: Routed,
    built: Built,
) -> Bound:
    """The programs' trace context, the logger and checkpointer bound to the run,
    the probe that the output directories can be written (found now, not after an
    epoch), and then the resume's log lines."""
    config, located = splits.config, position.located
    ctx = TraceContext(
        cls=resolved.cls,
        view=compile_view(converted.experiment),
        device_names=device_fields(resolved.cls),
        hooks=resolved.hooks,
        model=built.model,
        graphconst=graphconst_values(converted.experiment),
        compile_options=dict(config.compile_options),
        precision=config.precision,
        placement=routed.placement,
    )
    binding = bind_run(
        config, converted.experiment, routed.data, located.resume, located.record
    )
    unwritable = probe_outputs(
        config.checkpointer,
        config.logger,
        trains="train" in routed.data,
        loads=located.record is not None or located.weights is not None,
    )
    log_resume(config.logger, binding, located.resume, located.record)
    return Bound(ctx, binding, unwritable)


def total_steps(config: RunConfig, sizes: Mapping[str, int]) -> int:
    """The schedule horizon: max_epochs * (train batches // accum), or max_steps
    when that comes first."""
    per_epoch = config.accumulation.steps(sizes.get("train", 0))
    total = config.max_epochs * per_epoch
    return total if config.max_steps is None else min(total, config.max_steps)


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


# ------------------------------------------------------------------- stages ------
def resolve_settings(e: Any, keywords: Mapping[str, Any]) -> Resolved:
    """Check the experiment, resolve every run value (before any long work), and
    freeze the hooks: this handle keeps running today's code."""
    cls = type(e)
    check_required_hooks(cls, has_data="data" in keywords)
    refuse_hook_fields(e)
    refuse_later_features(e, keywords)
    _check_markers(e)
    assert_graphconst_hashable(e)
    # Join the processes the environment names (nitro launch) before any backend
    # starts; None in a run of one process.
    dist = distributed_from_environment()
    config = RunConfig.resolve(e, keywords)
    check_resume_flag(config)
    if not is_rank0() and config.logger is not None:
        # Rank 0 logs for the run: the other processes train the same steps.
        config = config.with_value("logger", None, source=config.sources["logger"])
    snapshot = {name: safe_accessor(e, name) for name in SCALAR_ACCESSORS}
    # Manual mode (the experiment's own train_step), read once and frozen.
    manual = is_manual(e)
    runtime = [name for name in RUNTIME_HOOKS if has_hook(cls, name)]
    if manual:
        check_manual_config(cls, config)
        runtime = manual_hooks(cls, runtime)
    hooks = freeze_hooks(cls, runtime)
    # The monitor defaults to ("loss", "min") when the loss is sure to exist.
    if config.monitor is None and ("metrics" not in hooks or config.eval_loss):
        config = config.with_value("monitor", ("loss", "min"), source="default")
    return Resolved(cls, config, dist, snapshot, manual, hooks, hook_fingerprints(cls))


def _check_markers(e: Any) -> None:
    graphconst = set(graphconst_fields(type(e)))
    for name, fix in (("seed", "a seed sweep"), ("max_epochs", "a longer run")):
        if name in graphconst and name in field_names(type(e)):
            raise ConfigError(
                MARKED_GRAPHCONST.format(name=name, cls=type(e).__name__, fix=fix)
            )


def locate_run(resolved: Resolved) -> Position:
    """Locate what to resume or load before anything expensive runs; a resume
    locks the run it will write first, so two resumes of one run never pick the
    same record and file names, and continues its position and seed."""
    config = resolved.config
    lock = None
    if config.resume not in (None, False):
        # A read-only directory is not locked: the handle may only evaluate from
        # it, and the write probe refuses train() there.
        lock = lock_checkpoint_dir(
            config.checkpointer, config.run_dir, purpose="resume", unwritable_ok=True
        )
    try:
        located = restore.locate(config, config.run_dir, config.monitor)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    record = located.record
    if located.resume is None or record is None:
        return Position(config, located, 0, 0, None, lock)
    config = adopt_resumed_seed(config, record)
    if config.preset is None and record.header.preset is not None:
        config = config.with_value("preset", record.header.preset, source="record")
    header = record.header
    held = HeldStop.from_json(header.epoch_loss)  # the running loss of a cut epoch
    return Position(config, located, header.step, header.epoch, held, lock)


def build_splits(
    e: Any, keywords: Mapping[str, Any], resolved: Resolved, position: Position
) -> Splits:
    """The data (`build_data` on the pre-conversion experiment, or `data=`); a
    smoke run's cut to its first batches; each split's size checked."""
    config = position.config
    data = (
        keywords["data"]
        if "data" in keywords
        else hook_function(resolved.cls, "build_data")(e, resolved.dist)
    )
    if not isinstance(data, Mapping):
        raise HookError(
            f"build_data must return a dict of splits such as "
            f"{{'train': ..., 'val': ...}}; it returned {type(data).__name__}."
        )
    splits: dict[str, Any] = dict(data)
    uncut = None
    if config.smoke:  # the first batches of each split, checked as cut
        uncut = {name: check_split(name, s) for name, s in splits.items()}
        splits = {
            name: first_batches(s, smoke_batches(name, config.accum))
            for name, s in splits.items()
        }
    bind_run_seed(splits, config.seed)  # e.g. an ArraySource shuffles by the seed
    sizes = {name: check_split(name, s) for name, s in splits.items()}
    return Splits(follow_max_steps(config, splits, sizes), splits, sizes, uncut)


def derive_and_convert(
    e: Any, resolved: Resolved, position: Position, splits: Splits
) -> Converted:
    """derive's fields (or the record's), then the Device conversion: the
    experiment every later hook sees."""
    cls, located = resolved.cls, position.located
    record = located.record
    from_record = (
        located.weights is not None
        and record is not None
        and record.header.derived is not None
    )
    if from_record:
        assert record is not None
        derived = derived_from_record(cls, record)
    else:
        derived = _derived_by_hook(e, resolved, position, splits)
    derived = convert_derived(cls, derived, from_record=from_record)
    e = replace_fields(e, **{name: derived[name] for name in derived})
    assert_graphconst_hashable(e)
    if record is not None:  # after derive: a derived field compares too
        check_record_config(e, record, resuming=located.resume is not None)
    meta = config_metadata(cls)
    converted = {}
    for name in device_fields(cls):
        declared = meta[name].type if name in meta else None
        converted[name] = to_device(name, declared, getattr(e, name))
    return Converted(replace_fields(e, **converted), converted, tuple(derived))


def _derived_by_hook(
    e: Any, resolved: Resolved, position: Position, splits: Splits
) -> dict[str, Any]:
    derived = hook_function(resolved.cls, "derive")(e, splits.data) or {}
    if not isinstance(derived, Mapping):
        raise HookError(
            f"derive must return a dict of field values; it returned "
            f"{type(derived).__name__}."
        )
    check_field_names(
        resolved.cls, derived, "derive returned", "Every key must name a field."
    )
    record = position.located.record
    if position.located.weights is None or record is None:
        return dict(derived)
    # An older record holds no list of derived keys: derive runs, and the
    # record's Device values override what it returns.
    stored = record.device_values()
    devices = device_fields(resolved.cls)
    return {
        name: stored.get(name, value) if name in devices else value
        for name, value in derived.items()
    }


def route_splits(
    resolved: Resolved, position: Position, splits: Splits, converted: Converted
) -> Routed:
    """Probe one batch for routing and the split checks, compare a resume's data
    and code with its record, build the mesh, and give each split its prefetch
    settings (after the probe and the checks saw the data as build_data gave it)."""
    config = splits.config
    routing, eval_width = probe_routing(
        converted.experiment, resolved.hooks, splits.data, splits.sizes, config
    )
    signature = data_signature(splits.sizes, routing)
    record = position.located.record
    if position.located.resume is not None and record is not None:
        # Before the model is built: a refused resume costs no build.
        check_resumed_inputs(
            record.header,
            record.path,
            hook_prints=resolved.hook_prints,
            signature=signature,
            allow_changed_data=config.resume_changed_data,
        )
    placement, eval_width = run_mesh(
        config, resolved.dist, splits.sizes, routing, eval_width
    )
    data = auto_prefetch(splits.data)
    return Routed(routing, eval_width, signature, placement, data, check_prefetch(data))


def build_weights(
    resolved: Resolved, position: Position, converted: Converted
) -> Built:
    """The model (`build_model` on the converted experiment), the weights a
    source restores into it, at the position training starts from."""
    built = hook_function(resolved.cls, "build_model")(
        converted.experiment, jax.random.key(position.config.seed)
    )
    if not (isinstance(built, tuple) and len(built) == 3):
        raise HookError(
            "build_model must return (model, params, state); it returned "
            f"{type(built).__name__}. Return an empty dict as the state of a "
            "stateless model."
        )
    model, params, state = built
    built_state = TrainState.initial(params, state)
    located = position.located
    restored, weights_from = restore.restore_weights(
        built_state,
        located.weights,
        located.record,
        resuming=located.resume is not None,
        load_ema=position.config.load_ema,
    )
    state_now = restored._replace(
        step=position.step, epoch=position.epoch, held=position.held_stop
    )
    return Built(model, state_now, built_state.params, weights_from)


def plan_optimization(
    resolved: Resolved,
    position: Position,
    splits: Splits,
    converted: Converted,
    routed: Routed,
    built: Built,
) -> Optimization:
    """The optimizer plan and the early-stopping policy (none without a train
    split), a resume's counters, `restore_best`, and what of the record `train()`
    still reads (its optimizer state, for a resume or `restore_optimizer`)."""
    config, located, state = splits.config, position.located, built.state
    data = routed.data
    # Manual mode: the experiment's optimizer states, which its opt schedules bind
    # into, so the plan resolves those against what the states expose.
    manual_states = None
    if resolved.manual and "train" in data:
        manual_states = manual_opt_states(
            converted.experiment,
            built.model,
            state.params,
            state.model_state,
            None if routed.placement is None else routed.placement.mesh,
        )
    plan, stopper, anchor_sums = None, None, {}
    if "train" in data:
        stopper = _stopper(resolved, config, data)
        plan = _plan(resolved, position, splits, converted, built, manual_states)
        anchor_sums = anchor_checksums(plan)
        if position.resuming:
            assert located.record is not None
            restore_counters(located.record, plan, stopper, anchor_sums)
    if manual_states is not None and plan is not None:
        check_manual_plan(resolved.cls, plan)
        state = state.with_weights(opt_state=manual_states)
    restore_best = restore.check_restore_best(config, data)
    restore.check_restore_optimizer(config, data)
    record = located.record
    if record is not None:
        if located.resume is None and not config.restore_optimizer:
            record = None  # weights only: nothing more to read from it
        else:
            record.keep_only("opt_state")  # restored when train() starts
    schedules = () if plan is None else plan.schedules
    return Optimization(
        plan=plan,
        stopper=stopper,
        anchor_sums=anchor_sums,
        device_schedules=tuple(
            (s.target, converted.device_values[s.target.name].dtype)
            for s in schedules
            if s.target.namespace == "device"
        ),
        restore_best=restore_best,
        state=state,
        pending_record=record,
    )


def _stopper(resolved: Resolved, config: RunConfig, data: Mapping[str, Any]) -> Any:
    """The early-stopping policy bound to the monitor; it needs a val split."""
    policy = config.early_stop
    if policy is not None and "val" not in data:
        raise ConfigError(
            "early_stop needs a val split: it is checked once per epoch after "
            "validation, and this run has none."
        )
    stopper = bind_stopper(policy, config.monitor)
    _check_control_metric(resolved, getattr(stopper, "metric", None), "EarlyStopping")
    return stopper


def _plan(
    resolved: Resolved,
    position: Position,
    splits: Splits,
    converted: Converted,
    built: Built,
    manual_states: Any,
) -> Any:
    """The optimizer plan; every Plateau needs a val split and a metric that
    validation reports."""
    config, located = splits.config, position.located
    params = built.state.params
    plan = build_plan(
        converted.experiment,
        params,
        w0_provider(
            config.w0,
            built.fresh,
            params,
            located.weights is not None,
            resuming=located.resume is not None,
        ),
        PlanInputs(
            schedules=config.schedules,
            clip_norm=float(config.gradient_clip_norm),
            ema=config.ema,
            total=total_steps(config, splits.sizes),
            monitor=config.monitor,
            device_fields=device_fields(resolved.cls),
            manual_fields=None
            if manual_states is None
            else hyperparameters_by_subtree(manual_states),
        ),
    )
    for schedule in plan.schedules:
        if schedule.plateau is not None:
            if "val" not in splits.data:
                raise ConfigError(
                    f"The Plateau on schedule `{schedule.key}` needs a val split: "
                    f"it is updated once per epoch from validation."
                )
            _check_control_metric(resolved, schedule.plateau.metric, "Plateau")
    return plan


def _check_control_metric(resolved: Resolved, metric: str | None, what: str) -> None:
    """Without custom metrics the only validation metric is the loss."""
    if metric is not None and "metrics" not in resolved.hooks and metric != "loss":
        raise ConfigError(
            f"{what} watches `{metric}`, but {resolved.cls.__name__} defines no "
            f'metrics, so validation reports only `loss`. Watch "loss", or '
            f"define metrics()."
        )
