"""`Nitro`: the handle of one run. Constructing it runs setup and nothing else.

    nitro = Nitro(MnistMLP(max_epochs=20), run_dir="runs/mnist")  # setup only
    nitro.train()                       # the automatic loop
    nitro.evaluate(split="test")        # {"acc": ..., ...}
    nitro.predict({"img": images})      # host outputs, padding invisible

Setup, in order: resolve the run keywords and accessors (the logger and checkpointer
accessors are called exactly once), freeze the hooks, locate a checkpoint to resume
from, seed, build the data (or take `data=`), derive, place the Device fields on the
device, probe one batch for routing and the split checks, build the model, restore
weights, and log the parameters and the binding report. Nothing is compiled and no
optimizer state is allocated until a verb needs it.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import restore
from .accessors import (
    ACCESSOR_KEYWORDS,
    RUN_KEYWORDS,
    SCALAR_ACCESSORS,
    Resolved,
    accessor_value,
    refuse_later_features,
    resolve,
)
from .checkpoint.checkpointer import Checkpointer, new_run_id
from .checkpoint.manifest import read_manifest
from .checkpoint.record import Record
from .checkpoint.retention_checks import check_keep, setup_warnings
from .checkpoint.sources import ResolvedSource
from .compile.cache import configure_persistent_cache
from .compile.programs import TraceContext
from .data.prefetch import auto_prefetch, check_prefetch, prefetch_report
from .data.protocol import release_splits
from .data.sources import (
    batch_at_index,
    batch_size,
    check_split,
    first_batch,
)
from .errors import (
    ConfigError,
    HookError,
    NitroWarning,
    NotYetSupportedError,
    RoutingError,
)
from .experiment import summarize
from .hooks import (
    RUNTIME_HOOKS,
    check_required_hooks,
    current_class,
    freeze,
    has_hook,
    hook_fingerprints,
    hook_function,
)
from .logging import protocol as logproto
from .markers import Kind
from .observe import phases
from .observe.entry import entry_point
from .observe.history import MetricHistory
from .observe.interrupt import StopOnInterrupt
from .observe.progress import Progress
from .observe.report import (
    binding_report,
    emit_stale_report,
    frozen_table,
    frozen_values,
    show_report,
    stale_report,
)
from .observe.transitions import PhaseRecorder
from .optim.plan import OptimizerPlan
from .optim.setup import PlanInputs, anchor_checksums, build_plan, check_ema
from .optim.stopping import bind_stopper
from .presets import from_preset, presets
from .routing import HookFields, hook_fields
from .traits import config_metadata, device_fields, field_names, graphconst_fields
from .values import to_device, to_host_array, to_host_value
from .view import (
    assert_graphconst_hashable,
    check_field_names,
    compile_view,
    graphconst_record,
    graphconst_values,
    replace_fields,
)

_NOT_PASSED: Any = object()


class Nitro:
    """The state of one run: model, weights, optimizer, data and counters.

    `Nitro(e, **kw)` runs setup only; `train`, `validate`, `evaluate` and `predict`
    work on it, trained or not. `Nitro(E, "preset", **kw)` builds the experiment from
    a named preset: run keywords go to the handle, field names to the recipe.

    Args:
        experiment: an experiment instance, or an experiment class with a preset name.
        preset: the preset name, in the class form.
        **kwargs: run keywords (seed, run_dir, accum, max_epochs, gradient_clip_norm,
            check_divergence, log_every_n_steps, logger, checkpointer, monitor,
            eval_loss, data, weights, resume, compile_options, run_ref, ...).

    Example::

        nitro = Nitro(MyExp(), run_dir="runs/demo")   # setup only: nothing compiled
        nitro.train()                                 # the automatic loop
        nitro.history[-1]["loss"]                     # the last validation loss
    """

    def __init__(
        self, experiment: Any, preset: str | None = None, /, **kwargs: Any
    ) -> None:
        experiment, kwargs = _split_preset_form(experiment, preset, kwargs)
        unknown = sorted(set(kwargs) - set(RUN_KEYWORDS) - {"checkpoint"})
        if unknown:
            raise ConfigError(
                f"Unknown Nitro keyword{'s' if len(unknown) > 1 else ''} "
                f"{', '.join(unknown)}. The run keywords are: "
                f"{', '.join(RUN_KEYWORDS)}."
            )
        if "checkpoint" in kwargs:
            warnings.warn(
                "checkpoint= is the deprecated spelling of weights=; use weights=.",
                DeprecationWarning,
                stacklevel=2,
            )
            kwargs["weights"] = kwargs.pop("checkpoint")
        self._keywords = dict(kwargs)
        self._preset: str | None = kwargs.get("preset")
        self._stop_requested = False
        self._stop_reason: str | None = None
        self._history: list[dict[str, Any]] = []
        self._executables: dict[Any, Any] = {}
        self._step = 0
        self._epoch = 0
        self._logger: Any = None
        self.phase_recorder = PhaseRecorder(self)
        self._progress: Progress | None = None
        self._released = False
        with entry_point() as entry, Progress() as progress:
            self._progress = progress
            progress.begin("setup")
            try:
                self._setup(experiment)
            finally:
                self._progress = None
            entry.attach(self)
        run_ref = kwargs.get("run_ref")
        if run_ref is not None:
            _fill_ref(run_ref, self)

    # ------------------------------------------------------------------ setup -------
    def _setup(self, e: Any) -> None:
        cls = type(e)
        self._cls = cls
        kw = self._keywords
        data_given = "data" in kw
        check_required_hooks(cls, has_data=data_given)
        refuse_later_features(e, kw)
        self._check_markers(e)
        assert_graphconst_hashable(e)

        self._config: dict[str, Resolved] = {
            name: resolve(e, name, kw)
            for name in ACCESSOR_KEYWORDS
            if name not in ("logger", "checkpointer")
        }
        self._accessor_snapshot = {
            name: _safe_accessor(e, name) for name in SCALAR_ACCESSORS
        }
        self._check_run_values()
        run_dir = str(self._config["run_dir"].value)
        self._config["logger"] = resolve(e, "logger", kw)
        self._config["checkpointer"] = resolve(e, "checkpointer", kw)
        self._logger = self._config["logger"].value
        self._checkpointer = self._config["checkpointer"].value
        if self._checkpointer is not None and not isinstance(
            self._checkpointer, Checkpointer
        ):
            raise ConfigError(
                f"checkpointer must be a Checkpointer or None, got "
                f"{type(self._checkpointer).__name__}."
            )
        self._compile_options = _check_compile_options(kw.get("compile_options"))

        # Freeze the hooks: this handle keeps running today's code.
        self._hooks = {
            name: freeze(hook_function(cls, name))
            for name in RUNTIME_HOOKS
            if has_hook(cls, name)
        }
        self._hook_prints = hook_fingerprints(cls)

        # Locate what to resume or load before anything expensive runs.
        self._resume: ResolvedSource | None = None
        self._weights: Any = None
        self._record: Record | None = None
        self.checkpoint_source: str | None = None
        self.weights_from: dict[str, Any] | None = None
        self._restored_best = False
        restore.locate(self, run_dir, self._resolve_monitor())
        self._step = 0
        self._epoch = 0
        self._resumed_from_epoch: int | None = None
        if self._resume is not None and self._record is not None:
            self._adopt_resumed_seed()
            self._step = int(self._record.meta["step"])
            self._epoch = int(self._record.meta["epoch"])
            self._resumed_from_epoch = self._epoch
            if self._preset is None:
                self._preset = self._record.meta.get("preset")

        seed = int(self._config["seed"].value)
        random.seed(seed)
        np.random.seed(seed % 2**32)

        # Data, then derive, on the pre-conversion experiment.
        self._setup_phase("building data")
        data = kw["data"] if data_given else hook_function(cls, "build_data")(e, None)
        if not isinstance(data, Mapping):
            raise HookError(
                f"build_data must return a dict of splits such as "
                f"{{'train': ..., 'val': ...}}; it returned {type(data).__name__}."
            )
        self.data: dict[str, Any] = dict(data)
        self._split_sizes = {
            name: check_split(name, s) for name, s in self.data.items()
        }

        derived_from_record = (
            self._weights is not None
            and self._record is not None
            and "derived" in self._record.meta
        )
        if derived_from_record:
            assert self._record is not None
            stored = self._record.device_values()
            derived = {
                name: stored[name]
                for name in self._record.meta["derived"]
                if name in stored
            }
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

        self._probe_routing()
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
        # Own copies: the optimizer program donates (overwrites) the parameters.
        self._params = jax.tree.map(jnp.array, params)
        self._state = jax.tree.map(jnp.array, state)
        self._opt_state: Any = None
        self._accumulator: Any = None
        self._ema: Any = None
        fresh = self._params
        restore.restore_weights(self, fresh, bool(kw.get("load_ema", False)))
        self._setup_optimization(fresh, kw.get("w0"))
        self._restore_best = restore.check_restore_best(self)
        restore.check_restore_optimizer(self)
        if self._record is not None:
            if self._resume is None and not kw.get("restore_optimizer", False):
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
            compile_options=self._compile_options,
        )
        self._bind_run(run_dir)
        configure_persistent_cache()

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

    def _check_run_values(self) -> None:
        c = self._config
        for name in ("accum", "max_epochs", "log_every_n_steps"):
            value = c[name].value
            if not isinstance(value, int | np.integer) or isinstance(value, bool):
                raise ConfigError(f"{name} must be an int, got {value!r}.")
            low = 0 if name == "max_epochs" else 1
            if value < low:
                raise ConfigError(f"{name} must be >= {low}, got {value}.")
        if int(c["n_devs"].value) != 1:
            raise NotYetSupportedError(
                f"n_devs={c['n_devs'].value}: sharding a batch over several devices is "
                f"not supported yet; this jaxnitro runs on one device (n_devs=1)."
            )
        monitor = c["monitor"].value
        if monitor is not None:
            c["monitor"] = Resolved(_check_monitor(monitor), c["monitor"].source)

    def _check_record_config(self, e: Any, record: Record) -> None:
        stored = record.meta.get("graphconst", {})
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
            stacklevel=4,
        )

    def _adopt_resumed_seed(self) -> None:
        assert self._record is not None
        recorded = int(self._record.meta["seed"])
        passed = int(self._config["seed"].value)
        if recorded != passed:
            warnings.warn(
                f"Resuming {self._record.path} with its recorded seed {recorded}; the "
                f"seed given here ({passed}) is ignored, since a resume continues the "
                f"run it names.",
                NitroWarning,
                stacklevel=4,
            )
        self._config["seed"] = Resolved(recorded, "record")

    def _probe_routing(self) -> None:
        """Resolve routing from one batch, and check the train split's shape."""
        self._fields: dict[str, HookFields] = {
            name: hook_fields(name, self._hooks[name])
            for name in ("forward", "loss", "metrics", "train_metrics")
            if name in self._hooks
        }
        self._train_fields: tuple[str, ...] = ()
        self._train_batch: int | None = None
        self._eval_width: int | None = None
        if "train" in self.data:
            source = self.data["train"]
            batch = first_batch("train", source)
            keys = tuple(batch)
            self._gradient_fields = self._route_training(keys)
            self._train_fields = tuple(
                dict.fromkeys(
                    self._gradient_fields.forward
                    + self._gradient_fields.loss
                    + (self._gradient_fields.train_metrics or ())
                )
            )
            _check_numeric(batch, self._train_fields, "train")
            self._train_batch = batch_size(batch, self._train_fields)
            count, accum = self._split_sizes["train"], int(self._config["accum"].value)
            if count % accum:
                raise ConfigError(
                    f"The train split has {count} batches, which does not divide by "
                    f"accum={accum} ({count} % {accum} = {count % accum}): every "
                    f"optimizer step takes {accum} micro-batches. Change the batch "
                    f"size or accum so the batch count divides."
                )
            if count == 0:
                raise ConfigError("The train split has no batches.")
            last = batch_at_index(source, count - 1) if count > 1 else None
            if last is not None:
                last_size = batch_size(last, self._train_fields)
                if last_size != self._train_batch:
                    raise ConfigError(_partial_message(last_size, self._train_batch))
        # The eval programs' batch width: the first batch of val, else test, else
        # any split; with no data at all, the first batch predict is handed.
        usual = ("val", "test", "train")
        order = [n for n in usual if n in self.data]
        order += [n for n in self.data if n not in usual]
        for name in order:
            if self._split_sizes[name] > 0:
                probe = first_batch(name, self.data[name])
                forward = self._fields["forward"].select(tuple(probe))
                self._eval_width = batch_size(probe, forward)
                break

    def _route_training(self, keys: tuple[str, ...]) -> Any:
        from .compile.programs import GradientFields

        device_tm = (
            "train_metrics" in self._fields
            and self._residency("train_metrics") == "device"
        )
        return GradientFields(
            forward=self._fields["forward"].select(keys),
            loss=self._fields["loss"].select(keys),
            train_metrics=(
                self._fields["train_metrics"].select(keys) if device_tm else None
            ),
            host_outputs="train_metrics" in self._fields and not device_tm,
        )

    def _residency(self, hook: str) -> str:
        """Where metric hook `hook` runs, resolved once and frozen with the handle."""
        frozen = self.__dict__.setdefault("_residencies", {})
        if hook not in frozen:
            where = hook_function(self._cls, "metrics_residency")(
                self._experiment, hook
            )
            if where not in ("host", "device"):
                raise ConfigError(
                    f'metrics_residency({hook!r}) must return "host" or "device", '
                    f"got {where!r}."
                )
            frozen[hook] = str(where)
        return str(frozen[hook])

    def _resolve_monitor(self) -> tuple[str, str] | None:
        """The monitor, defaulting to ("loss", "min") when the loss is sure to exist."""
        monitor = self._config["monitor"].value
        if monitor is None and (
            "metrics" not in self._hooks or bool(self._config["eval_loss"].value)
        ):
            monitor = ("loss", "min")
            self._config["monitor"] = Resolved(monitor, "default")
        return monitor  # type: ignore[no-any-return]

    def _setup_optimization(self, fresh: Any, w0_option: Any) -> None:
        """The optimizer plan, the early-stopping policy and the eval weights."""
        c = self._config
        ema = check_ema(c["ema"].value)
        eval_weights = self._keywords.get("eval_weights")
        if eval_weights is None:
            eval_weights = "ema" if ema is not None else "raw"
        if eval_weights not in ("ema", "raw"):
            raise ConfigError(f'eval_weights={eval_weights!r}: it is "ema" or "raw".')
        if eval_weights == "ema" and ema is None:
            raise ConfigError(
                'eval_weights="ema" needs an EMA of the weights: set ema() on the '
                "experiment or pass ema=EMA(beta)."
            )
        self._eval_weights = eval_weights
        monitor = self._resolve_monitor()
        self._plan: OptimizerPlan | None = None
        self._stopper: Any = None
        self._anchor_sums: dict[str, str] = {}
        self._device_schedules: list[tuple[Any, Any]] = []
        if "train" not in self.data:
            return  # nothing to optimize: no plan, no optimizer state
        has_val = "val" in self.data
        policy = c["early_stop"].value
        if policy is not None and not has_val:
            raise ConfigError(
                "early_stop needs a val split: it is checked once per epoch after "
                "validation, and this run has none."
            )
        self._stopper = bind_stopper(policy, monitor)
        self._check_control_metric(
            getattr(self._stopper, "metric", None), "EarlyStopping"
        )
        self._plan = build_plan(
            self._experiment,
            self._params,
            _w0_provider(w0_option, fresh, self._params, self._weights is not None),
            PlanInputs(
                schedules=c["schedules"].value,
                clip_norm=float(c["gradient_clip_norm"].value),
                ema=ema,
                total=self.total_steps,
                monitor=monitor,
                device_fields=device_fields(self._cls),
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
            self._restore_counters(self._record.meta)

    def _check_control_metric(self, metric: str | None, what: str) -> None:
        """Without custom metrics the only validation metric is the loss."""
        if metric is not None and "metrics" not in self._hooks and metric != "loss":
            raise ConfigError(
                f"{what} watches `{metric}`, but {self._cls.__name__} defines no "
                f'metrics, so validation reports only `loss`. Watch "loss", or '
                f"define metrics()."
            )

    def _restore_counters(self, meta: dict[str, Any]) -> None:
        """A resume continues the early-stopping and Plateau counters, and verifies
        that every decay anchor is the one the record trained toward."""
        assert self._plan is not None
        stored = meta.get("anchor_checksums") or {}
        for group, checksum in self._anchor_sums.items():
            if group in stored and stored[group] != checksum:
                raise ConfigError(
                    f"Cannot resume from {self._record.path if self._record else ''}: "
                    f"group {group!r} decays toward an anchor that differs from the "
                    f"one the record trained toward (checksum mismatch). An anchored "
                    f"run resumes only when its anchor is rebuilt identically."
                )
        if self._stopper is not None and meta.get("early_stop"):
            restore = getattr(self._stopper, "restore", None)
            if callable(restore):
                restore(meta["early_stop"])
        plateaus = meta.get("plateau") or {}
        for schedule in self._plan.schedules:
            if schedule.plateau is not None and schedule.key in plateaus:
                schedule.plateau.restore(plateaus[schedule.key])

    def _bind_run(self, run_dir: str) -> None:
        """Point the logger and checkpointer at the run; log params and bindings."""
        self._run_dir = run_dir
        monitor = self._resolve_monitor()
        self._monitor = monitor
        ckpt = self._checkpointer
        has_val = "val" in self.data
        trains = "train" in self.data
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
            parent = None
            resume = self._resume
            if resume is not None and resume.entry is not None and resume.is_run_newest:
                # The newest record of a run continues that run (a legacy run: None).
                run_id = resume.entry.run
            else:
                run_id = new_run_id()
                parent = resume.path if resume is not None else None
            self._run_id: str | None = run_id
            ckpt.bind(directory=run_dir, monitor=monitor, run=run_id, parent=parent)
            if trains and ckpt.dir is not None:
                for text in setup_warnings(ckpt, read_manifest(ckpt.dir), trains=True):
                    warnings.warn(text, NitroWarning, stacklevel=4)
        else:
            self._run_id = new_run_id()
        bind = getattr(self._logger, "bind_run_dir", None)
        if callable(bind):
            bind(run_dir)
        if self._resume is not None and self._record is not None:
            state = self._record.meta.get("logger_state")
            if state is not None and self._logger is not None:
                recorded_type = self._record.meta.get("logger_type")
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
        logproto.log_params(self._logger, self.params_to_log())
        report = self.binding_report()
        logproto.log_other(self._logger, "binding_report", report)
        show_report(f"jaxnitro: {self._cls.__name__}", report)

    # ------------------------------------------------------------ public reads ------
    @property
    def experiment(self) -> Any:
        """The experiment after device conversion; Device fields hold device values."""
        return self._experiment

    @property
    def parameters(self) -> Any:
        """The parameters as build_model returned them (trained values after train).

        They are device arrays owned by the handle: the next optimizer step donates
        them, so copy them (e.g. `jax.device_get`) to keep a snapshot.
        """
        return self._params

    @property
    def states(self) -> Any:
        """The model state (running statistics and the like)."""
        return self._state

    @property
    def run_dir(self) -> str:
        """The directory checkpoints, the manifest and the default log resolve to."""
        return self._run_dir

    @property
    def current_step(self) -> int:
        """The number of optimizer steps taken."""
        return self._step

    @property
    def current_epoch(self) -> int:
        """The current epoch, 0 before the first one begins."""
        return self._epoch

    @property
    def phase(self) -> phases.Phase:
        """The run's current phase: the latest recorded transition (Starting until
        the first). Idle, announced when control returns, is never recorded."""
        return self.phase_recorder.phase

    @property
    def history(self) -> MetricHistory:
        """The epochs this handle trained, as a `MetricHistory` table.

        Each row: epoch, step, train_loss, the epoch's validation metrics, seconds.
        A resumed handle's history begins at the first epoch it trained itself.
        """
        ckpt = self._checkpointer
        if ckpt is not None and ckpt.metric is not None:
            selection: tuple[str, str] | None = (ckpt.metric, ckpt.mode or "min")
        else:
            selection = self._monitor
        return MetricHistory(
            self._history,
            selection_metric=selection,
            resumed_from_epoch=self._resumed_from_epoch,
        )

    @property
    def logger_info(self) -> dict[str, Any]:
        """Plain data identifying where the run's logger writes."""
        return logproto.logger_info(self._logger)

    @property
    def logger(self) -> Any:
        """The run's logger object (None when logging is off)."""
        return self._logger

    @property
    def checkpointer(self) -> Checkpointer | None:
        """The run's checkpointer (None when checkpointing is off)."""
        return self._checkpointer

    @property
    def stop_reason(self) -> str | None:
        """How the last train() ended: completed, requested or error."""
        return self._stop_reason

    @property
    def checkpoint_run(self) -> str | None:
        """The id this handle's checkpoints are written under."""
        return self._run_id if self._checkpointer is not None else None

    def frozen(self) -> dict[str, Any]:
        """The values this handle fixed at construction."""
        c = self._config
        values: dict[str, Any] = {"seed": c["seed"].value}
        if self._preset is not None:
            values["preset"] = self._preset
        values["accum"] = c["accum"].value
        values["max_epochs"] = c["max_epochs"].value
        if "train" in self.data:
            values["total"] = self.total_steps
        values["clip"] = c["gradient_clip_norm"].value
        values["run_dir"] = self._run_dir
        return values

    @property
    def total_steps(self) -> int:
        """The schedule horizon: max_epochs * (train batches // accum)."""
        per_epoch = self._split_sizes.get("train", 0) // int(
            self._config["accum"].value
        )
        return int(self._config["max_epochs"].value) * per_epoch

    def __rich__(self) -> Any:
        """The frozen values as a rich table (a terminal); `repr` is the plain text."""
        return frozen_table(
            f"Nitro({self._cls.__name__}) values fixed at construction",
            self.frozen(),
            f"step {self._step}   epoch {self._epoch}   phase "
            f"{type(self.phase).__name__}   (rebuild the Nitro to change them)",
        )

    def __repr__(self) -> str:
        return (
            f"Nitro({self._cls.__name__}) values fixed at construction (rebuild the "
            f"`Nitro` to change them)\n  {frozen_values(self.frozen())}\n"
            f"  step {self._step}   epoch {self._epoch}   phase "
            f"{type(self.phase).__name__}"
        )

    def params_to_log(self) -> dict[str, Any]:
        """The flat hyperparameters log_params receives."""
        params: dict[str, Any] = {}
        meta = config_metadata(self._cls)
        for name in field_names(self._cls):
            value = getattr(self._experiment, name, None)
            kind = meta[name].kind if name in meta else "graphconst"
            if isinstance(value, jax.Array | np.ndarray | np.generic):
                if np.ndim(value) == 0:
                    params[name] = to_host_value(value)
                else:
                    params[name] = summarize(value)
            elif value is None or isinstance(value, bool | int | float | str):
                params[name] = value
            elif kind != Kind.HOST.value:
                params[name] = type(value).__name__
        for name in ("seed", "accum", "max_epochs", "gradient_clip_norm", "run_dir"):
            params[name] = (
                self._config[name].value if name != "run_dir" else self._run_dir
            )
        if self._preset is not None:
            params["preset"] = self._preset
        return params

    def binding_report(self) -> str:
        """Where each configured value bound, the data, and the routed fields."""
        routing: dict[str, tuple[str, ...]] = {}
        if "train" in self.data:
            g = self._gradient_fields
            routing["forward"] = g.forward
            routing["loss"] = g.loss
            if g.train_metrics is not None:
                routing["train_metrics"] = g.train_metrics
        notes = []
        if self._plan is not None:
            groups = ", ".join(
                f"{g.name} (level {g.rule.level}, lr x{g.lr_ratio:g}"
                + (f", decay {g.weight_decay:g}" if g.decays else "")
                + (", anchored" if g.anchor is not None else "")
                + ")"
                for g in self._plan.groups
            )
            notes.append(f"learning_rate {self._plan.base_lr:g}; groups: {groups}")
            for s in self._plan.schedules:
                where = s.target.namespace + (
                    f".{s.target.group}" if s.target.group else ""
                )
                plateau = " (Plateau)" if s.plateau is not None else ""
                notes.append(f"schedule {s.key} -> {where}.{s.target.name}{plateau}")
            notes.append(f"grad_rule {self._plan.grad_rule!r}")
            if self._plan.ema is not None:
                notes.append(
                    f"ema {self._plan.ema!r}, eval_weights {self._eval_weights}"
                )
        if self._eval_width is not None:
            notes.append(f"eval batch width {self._eval_width}")
        if "train" in self._prefetch:
            entries = prefetch_report(self._prefetch["train"])
            notes.append(
                "train prefetch: " + ", ".join(f"{k} {v}" for k, v in entries.items())
            )
        return binding_report(
            self._cls.__name__, self._config, self._split_sizes, routing, notes
        )

    # ------------------------------------------------------------- stale check ------
    def _check_stale(self, entry: str) -> None:
        now_cls = current_class(self._cls)
        names = SCALAR_ACCESSORS if entry == "train" else ("seed", "run_dir")
        changes = {}
        for name in names:
            then = self._accessor_snapshot.get(name, _NOT_PASSED)
            now = _safe_accessor(self._experiment, name, now_cls)
            if then is _NOT_PASSED or now is _NOT_PASSED:
                continue
            if name == "monitor" and now is not None:
                now = _check_monitor(now)
            if _differs(then, now):
                changes[name] = (then, now)
        prints = hook_fingerprints(now_cls)
        redefined = [
            name
            for name in prints.keys() | self._hook_prints.keys()
            if prints.get(name) != self._hook_prints.get(name)
        ]
        redefined.sort(
            key=lambda n: list(prints.keys() | self._hook_prints.keys()).index(n)
        )
        emit_stale_report(stale_report(self._cls.__name__, changes, sorted(redefined)))

    # ------------------------------------------------------------------ verbs -------
    def train(self) -> Nitro:
        """Run the training loop until max_epochs or a requested stop; return self."""
        from .loop.train import run_training

        self._check_stale("train")
        restore.refuse_after_restore_best(self)
        self._run_entry(lambda: run_training(self))
        return self

    def validate(self) -> dict[str, Any]:
        """Run the val split and return its finalized metrics."""
        from .loop.evaluate import evaluate_split

        self._check_stale("validate")
        if "val" not in self.data:
            raise ConfigError(
                f"validate() needs a val split; the data holds: "
                f"{', '.join(self.data) or 'no splits'}."
            )
        return self._run_entry(lambda: evaluate_split(self, "val"))

    def evaluate(self, split: str = "test") -> dict[str, Any]:
        """Run any named split and return its finalized metrics."""
        from .loop.evaluate import evaluate_split

        self._check_stale("evaluate")
        if split not in self.data:
            raise ConfigError(
                f"evaluate(split={split!r}): the data has no split {split!r}. The "
                f"splits are: {', '.join(self.data) or 'none'}."
            )
        return self._run_entry(lambda: evaluate_split(self, split))

    def predict(self, batch: Any) -> Any:
        """Forward alone, in eval mode, on a batch dict or an iterable of them.

        A batch dict gives its outputs as host arrays sliced to the real sample
        count; an iterable gives a lazy iterator of them, one per batch.
        """
        from .loop.evaluate import predict_batch

        if isinstance(batch, Mapping) or hasattr(batch, "_asdict"):
            return self._run_entry(lambda: predict_batch(self, batch))
        if isinstance(batch, np.ndarray | jax.Array) or not isinstance(batch, Iterable):
            fields = self._fields["forward"]
            names = fields.required + fields.optional
            shown = ", ".join(f"'{n}': ..." for n in names) or "..."
            raise RoutingError(
                f"predict takes a batch dict or an iterable of them, not a "
                f"{type(batch).__name__}: forward is routed by field name and declares "
                f"{', '.join(names) or 'no fields'}. Pass {{{shown}}}."
            )
        return self._predict_many(batch)

    def render(
        self,
        batch: Any = None,
        *,
        split: str = "val",
        batches: int = 1,
        predictions: bool = False,
        out_dir: str | None = None,
        tag: str | None = None,
    ) -> list[str]:
        """One figure per sample through `visualize` and `save_figure`; the paths.

        Without `batch`, the first `batches` batches of `split`; with it, that batch.
        `predictions=False` (the data gate) compiles and runs nothing on the device.
        """
        from .observe.render import render

        return self._run_entry(
            lambda: render(
                self,
                batch,
                split=split,
                batches=batches,
                predictions=predictions,
                out_dir=out_dir,
                tag=tag,
            )
        )

    def _predict_many(self, batches: Iterable[Any]) -> Iterator[Any]:
        from .loop.evaluate import predict_batch

        for batch in batches:
            yield self._run_entry(lambda b=batch: predict_batch(self, b))

    def _run_entry(self, work: Any) -> Any:
        """Run a public entry point: monitors adopted, Starting and Idle announced
        around the outermost call, Ctrl+C turned into request_stop(), one progress
        line. A stop request ends with the call that honoured it."""
        with entry_point(self), StopOnInterrupt(self.request_stop), Progress() as bar:
            outer, self._progress = self._progress, bar
            try:
                return work()
            finally:
                self._progress = outer
                if outer is None:
                    self._stop_requested = False

    def request_stop(self) -> None:
        """Ask a running train() to stop at the next step boundary, gracefully."""
        self._stop_requested = True

    def set_device(self, **values: Any) -> Nitro:
        """Write Device fields of the live handle; compiles nothing.

        Refused: a GraphConst field, a Host field, a scheduled field, a value that
        does not convert to the field's dtype, and an array of another shape.
        """
        cls = self._cls
        updates = {}
        for name, value in values.items():
            if name not in field_names(cls):
                raise ConfigError(
                    f"set_device: {cls.__name__} has no field `{name}`. Its Device "
                    f"fields are: {', '.join(device_fields(cls)) or 'none'}."
                )
            if name not in device_fields(cls):
                if name in graphconst_fields(cls):
                    raise ConfigError(
                        f"set_device: `{name}` is GraphConst: it bakes into the "
                        f"compiled graph, so a new value is a different program. Build "
                        f"a new Nitro with the new value (only what it changes "
                        f"recompiles)."
                    )
                raise ConfigError(
                    f"set_device: `{name}` is a Host field: no compiled program reads "
                    f"it, so writing it on a live handle would change nothing. Build a "
                    f"new Nitro with the new value, or mark the field Device."
                )
            if self._plan is not None and any(
                s.target.namespace == "device" and s.target.name == name
                for s in self._plan.schedules
            ):
                raise ConfigError(
                    f"set_device: `{name}` is scheduled: the schedule writes it every "
                    f"step and would overwrite this value. Remove it from schedules."
                )
            current = getattr(self._experiment, name)
            host = to_host_array(name, np.dtype(current.dtype), value)
            if host.shape != current.shape:
                raise ConfigError(
                    f"set_device: `{name}` has shape {tuple(current.shape)}; the new "
                    f"value has shape {host.shape}. Shapes are fixed by the compiled "
                    f"programs: build a new Nitro for another shape."
                )
            updates[name] = jax.device_put(host, current.sharding)
        self._experiment = replace_fields(self._experiment, **updates)
        self._device_values = {**self._device_values, **updates}
        return self

    def device_value(self, name: str) -> Any:
        """The host value of a Device field (a Python scalar or a NumPy array)."""
        if name not in device_fields(self._cls):
            kind = "a Host" if name in field_names(self._cls) else "no"
            raise ConfigError(
                f"device_value: `{name}` is {kind} field of {self._cls.__name__}, not "
                f"a Device field; read it as nitro.experiment.{name}. Device fields: "
                f"{', '.join(device_fields(self._cls)) or 'none'}."
            )
        return to_host_value(getattr(self._experiment, name))

    # -------------------------------------------------------- loop internals --------
    def device_values(self) -> dict[str, Any]:
        """The Device fields as the dict every program receives."""
        return self._device_values

    def eval_params(self) -> Any:
        """The weights evaluation, checkpoint selection and predict read: the EMA
        under eval_weights="ema" once one exists, the raw weights otherwise."""
        if self._eval_weights == "ema" and self._ema is not None:
            return self._ema
        return self._params

    def _sync_scheduled_devices(self) -> None:
        """Write the scheduled Device fields' current values into the experiment,
        so evaluation between epochs sees what training last used."""
        if not self._device_schedules:
            return
        assert self._plan is not None
        current = self._plan.schedule_values(max(self._step - 1, 0))
        updates = {
            target.name: jnp.asarray(current[target], dtype)
            for target, dtype in self._device_schedules
        }
        self._experiment = replace_fields(self._experiment, **updates)
        self._device_values = {**self._device_values, **updates}

    def set_phase(self, phase: phases.Phase, **info: Any) -> None:
        """Record `phase` and publish it to the monitors (a repeat is a no-op).

        The first Terminal phase releases the data sources, after the monitors ran.
        """
        if self.phase_recorder.set(phase, **info) and isinstance(
            phase, phases.Terminal
        ):
            self.release()

    def release(self) -> None:
        """Release every split's source (its `release()` method), once per handle.

        Training does this itself when it ends; call it for a handle that only
        validated, predicted or exported. A split whose release raises is warned
        about and the others are still released.
        """
        if not self._released:
            self._released = True
            release_splits(self.data)

    def progress(self) -> Progress | None:
        """The progress line of the entry point running now, if any."""
        return self._progress


def _split_preset_form(
    experiment: Any, preset: str | None, kwargs: dict[str, Any]
) -> tuple[Any, dict[str, Any]]:
    """`Nitro(E, "name", **kw)`: run keywords to the handle, fields to the recipe."""
    if not isinstance(experiment, type):
        if preset is not None:
            raise ConfigError(
                "Nitro(e, name): a preset name goes with the experiment class, "
                "Nitro(MyExp, name, ...), not with an instance."
            )
        return experiment, kwargs
    if preset is None:
        raise ConfigError(
            f"Nitro({experiment.__name__}) needs an instance, "
            f"Nitro({experiment.__name__}()), or a preset name: "
            f'Nitro({experiment.__name__}, "name", ...).'
        )
    if "data" in kwargs:
        raise ConfigError(
            "data= is refused in the preset form, since the collection would come "
            "from another instance than the one built here. Write "
            f"Nitro(from_preset({experiment.__name__}, {preset!r}), preset={preset!r}, "
            f"data=...)."
        )
    fields = set(field_names(experiment))
    run_kw = {k: v for k, v in kwargs.items() if k in RUN_KEYWORDS}
    overrides = {
        k: v for k, v in kwargs.items() if k not in RUN_KEYWORDS and k in fields
    }
    neither = sorted(set(kwargs) - set(run_kw) - set(overrides))
    if neither:
        raise ConfigError(
            f"{', '.join(neither)}: neither a run keyword nor a field of "
            f"{experiment.__name__}. Run keywords: {', '.join(RUN_KEYWORDS)}. Fields: "
            f"{', '.join(sorted(fields))}."
        )
    if preset not in presets(experiment):
        from_preset(experiment, preset)  # raises, listing the presets there are
    run_kw["preset"] = preset
    return from_preset(experiment, preset, **overrides), run_kw


def _check_monitor(monitor: Any) -> tuple[str, str]:
    if (
        isinstance(monitor, tuple)
        and len(monitor) == 2
        and monitor[1] in ("min", "max")
    ):
        name = str(monitor[0])
        if name == "val_loss":
            warnings.warn(
                'monitor "val_loss" is spelled "loss": metric names carry no split.',
                DeprecationWarning,
                stacklevel=4,
            )
            name = "loss"
        return (name, str(monitor[1]))
    raise ConfigError(
        f'monitor must be a (metric, mode) pair with mode "min" or "max", such as '
        f'("acc", "max"); got {monitor!r}.'
    )


def _check_compile_options(options: Any) -> dict[str, Any]:
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise ConfigError(
            f"compile_options must be a dict of XLA compiler options, got "
            f"{type(options).__name__}."
        )
    for key, value in options.items():
        if not isinstance(key, str) or not isinstance(value, bool | int | float | str):
            raise ConfigError(
                f"compile_options: {key!r}={value!r}; keys are XLA option names and "
                f"values are bool, int, float or str."
            )
    if options:
        try:
            jax.jit(lambda: jnp.zeros(())).lower().compile(
                compiler_options=dict(options)
            )
        except Exception as error:
            raise ConfigError(
                f"compile_options were refused by XLA: {error}. Check the option "
                f"names and values."
            ) from None
    return dict(options)


def _check_numeric(batch: Mapping[str, Any], names: Iterable[str], split: str) -> None:
    for name in names:
        value = batch[name]
        kind = np.asarray(value).dtype.kind if not isinstance(value, jax.Array) else "f"
        if kind not in "biufc":
            raise ConfigError(
                f"Batch field `{name}` of split `{split}` is not a numeric array "
                f"({type(value).__name__}); a field a traced hook declares is "
                f"transferred to the device. Keep bookkeeping such as names in fields "
                f"no traced hook declares."
            )


def _partial_message(last: int, full: int) -> str:
    return (
        f"The train split keeps a partial last batch ({last} samples, the others "
        f"{full}): a short batch would compile a second gradient program and weight "
        f"its samples differently. Drop it (drop_remainder=True / drop_last=True)."
    )


def _safe_accessor(e: Any, name: str, cls: type | None = None) -> Any:
    try:
        return accessor_value(e, name, cls).value
    except Exception:
        return _NOT_PASSED


def _differs(a: Any, b: Any) -> bool:
    try:
        return bool(a != b)
    except Exception:
        return False


def _fill_ref(ref: Any, nitro: Nitro) -> None:
    if hasattr(ref, "append"):
        ref.append(nitro)
    elif callable(ref):
        ref(nitro)
    else:
        raise ConfigError(
            "run_ref must be a list (the handle is appended) or a callable (called "
            f"with the handle); got {type(ref).__name__}."
        )


def train(experiment: Any, preset: str | None = None, /, **kwargs: Any) -> Nitro:
    """`Nitro(experiment, **kwargs).train()`: build a handle and train it."""
    if preset is None:
        return Nitro(experiment, **kwargs).train()
    return Nitro(experiment, preset, **kwargs).train()


def _w0_provider(
    option: Any, fresh: Any, params: Any, has_weights: bool
) -> Callable[[], Any]:
    """What decay_anchor="w0" anchors to, copied only if some group asks for it."""
    if option is None or (isinstance(option, str) and option == "build_model"):
        source = fresh
    elif isinstance(option, str) and option == "weights":
        if not has_weights:
            raise ConfigError(
                'w0="weights" anchors to the parameters a weights= source loads, but '
                "no weights= was given. Pass weights=..., or leave w0 at "
                '"build_model".'
            )
        source = params
    elif isinstance(option, str):
        raise ConfigError(
            f'w0={option!r}: it is "build_model", "weights", or a parameter tree.'
        )
    else:
        source = option
    cached: list[Any] = []

    def provide() -> Any:
        if not cached:
            tree = jax.tree.map(jnp.array, source)  # a copy: training donates params
            if jax.tree.structure(tree) != jax.tree.structure(params):  # type: ignore[operator]
                raise ConfigError(
                    "w0 is a tree that does not match the parameters' structure; it "
                    "must be shaped like what build_model returns."
                )
            cached.append(tree)
        return cached[0]

    return provide
