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

import warnings
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..checkpoint.checkpointer import Checkpointer
from ..data.protocol import has_release, release_splits, unwrap_source
from ..errors import (
    ConfigError,
    RoutingError,
)
from ..experiment.markers import Kind
from ..experiment.presets import from_preset, presets
from ..experiment.traits import (
    device_fields,
    field_kind_of,
    field_names,
    graphconst_fields,
)
from ..experiment.values import to_host_array, to_host_value
from ..experiment.view import (
    replace_fields,
)
from ..handle_type import RunHandle
from ..logging import protocol as logproto
from ..observe import phases
from ..observe.entry import entry_point
from ..observe.history import MetricHistory
from ..observe.interrupt import StopOnInterrupt
from ..observe.progress import Progress
from ..observe.transitions import PhaseRecorder
from . import restore
from .accessors import (
    RUN_KEYWORDS,
)
from .config import RunConfig
from .reports import HandleReports

RELEASED_REFUSAL = (
    "{verb}: split `{name}` ({kind}) was released by {by}, which ran its source's "
    "release() and closed what it holds open, so this handle cannot read it again. "
    "Build a new Nitro with its own data and this handle's weights: "
    "Nitro(e, weights=nitro) (build_data runs again unless data= is passed)."
)


class Nitro(HandleReports):
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

    Attributes:
        averaged_from: what an averaged weights source averaged (`weights=(run,
            Average(sel))`, or `restore_best=Average(...)` once training ends): the
            spec, run, dir, files, epochs and weights; None otherwise. The records
            this run writes carry it too.

    Example::

        nitro = Nitro(MyExp(), run_dir="runs/demo")   # setup only: nothing compiled
        nitro.train()                                 # the automatic loop
        nitro.history[-1]["train_loss"]               # the last epoch's train loss
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
        if "checkpoint" in kwargs and "weights" in kwargs:
            raise ConfigError(
                "checkpoint= and weights= were both passed; checkpoint= is the "
                "deprecated spelling of weights=, so one would silently win. Pass "
                "weights= alone."
            )
        if "checkpoint" in kwargs:
            warnings.warn(
                "checkpoint= is the deprecated spelling of weights=; use weights=.",
                DeprecationWarning,
                stacklevel=2,
            )
            kwargs["weights"] = kwargs.pop("checkpoint")
        self._keywords = dict(kwargs)
        self._stop_requested = False
        self._stop_reason: str | None = None
        self._history: list[dict[str, Any]] = []
        self._executables: dict[Any, Any] = {}
        self._step = 0
        self._epoch = 0
        self._logger: Any = None
        self.phase_recorder = PhaseRecorder(self)
        self._progress: Progress | None = None
        self._released_by: str | None = None  # what released the splits, if done
        with entry_point() as entry, Progress() as progress:
            self._progress = progress
            progress.begin("setup")
            try:
                self._setup(experiment)
                self.log_setup()
            finally:
                self._progress = None
            entry.attach(self)
        run_ref = kwargs.get("run_ref")
        if run_ref is not None:
            _fill_ref(run_ref, self)

    # ------------------------------------------------------------------ setup -------
    @property
    def experiment(self) -> Any:
        """The experiment after device conversion; Device fields hold device values."""
        return self._experiment

    @property
    def config(self) -> RunConfig:
        """The run's settings, fixed at construction: a frozen, typed `RunConfig`.

        One field per run keyword (`config.accum`, `config.monitor`, ...), each the
        keyword, else the experiment's method or field, else the default, with
        `config.sources` saying which; a resume's seed reads "record". Rebuild the
        `Nitro` to change one.
        """
        return self._run_config

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
        return self._run_config.run_dir

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
    def early_stop(self) -> Any:
        """This handle's early-stopping policy (None: it never stops early).

        An EarlyStopping passed in is copied at setup with the monitor filled in and
        fresh counters (`best`, `wait`), so this is that copy, never the instance
        passed; a custom policy (an object with `should_stop`) is held as given.
        """
        return self._stopper

    @property
    def stop_reason(self) -> str | None:
        """How the last train() ended: completed, requested or error."""
        return self._stop_reason

    @property
    def checkpoint_run(self) -> str | None:
        """The id this handle's checkpoints are written under."""
        return self._run_id if self._checkpointer is not None else None

    # ------------------------------------------------------------------ verbs -------
    def train(self, **kwargs: Any) -> Nitro:
        """Run the training loop until max_epochs or a requested stop; return self.

        It takes no keywords: every run setting was fixed when the handle was built.
        """
        from ..loop.train import run_training

        if kwargs:
            raise ConfigError(
                f"train() takes no keywords (got {', '.join(sorted(kwargs))}): every "
                f"run setting belongs to the Nitro constructor and is fixed there. "
                f"To train further, build a new handle that continues this run: "
                f'Nitro(e, resume="auto", max_epochs=N).'
            )
        self._check_stale("train")
        restore.refuse_after_restore_best(self)
        self._refuse_released("train()", ("train", "val"))
        self._run_entry(lambda: run_training(self))
        return self

    def validate(self) -> dict[str, Any]:
        """Run the val split and return its finalized metrics."""
        from ..loop.evaluate import evaluate_split

        self._check_stale("validate")
        if "val" not in self.data:
            raise ConfigError(
                f"validate() needs a val split; the data holds: "
                f"{', '.join(self.data) or 'no splits'}."
            )
        self._refuse_released("validate()", ("val",))
        return self._run_entry(lambda: evaluate_split(self, "val"))

    def evaluate(self, split: str = "test") -> dict[str, Any]:
        """Run any named split and return its finalized metrics."""
        from ..loop.evaluate import evaluate_split

        self._check_stale("evaluate")
        if split not in self.data:
            raise ConfigError(
                f"evaluate(split={split!r}): the data has no split {split!r}. The "
                f"splits are: {', '.join(self.data) or 'none'}."
            )
        self._refuse_released(f"evaluate(split={split!r})", (split,))
        return self._run_entry(lambda: evaluate_split(self, split))

    def predict(self, batch: Any) -> Any:
        """Forward alone, in eval mode, on a batch dict or an iterable of them.

        A batch dict gives its outputs as host arrays sliced to the real sample
        count; an iterable gives a lazy iterator of them, one per batch.
        """
        from ..loop.evaluate import predict_batch

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
        from ..loop.render import render

        if batch is None:
            self._refuse_released(f"render(split={split!r})", (split,))
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
        from ..loop.evaluate import predict_batch

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
            if any(target.name == name for target, _ in self._device_schedules):
                raise ConfigError(
                    f"set_device: `{name}` is scheduled: the schedule writes it every "
                    f"step and would overwrite this value. Build a new Nitro without "
                    f"`{name}` in its schedules to set it by hand."
                )
            current = getattr(self._experiment, name)
            try:
                host = to_host_array(name, np.dtype(current.dtype), value)
            except ConfigError as error:
                raise ConfigError(
                    f"set_device: {error} The field's dtype is fixed by the compiled "
                    f"programs: build a new Nitro for another dtype."
                ) from None
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
            kind = "no"
            if name in field_names(self._cls):
                marker = field_kind_of(self._cls, name)
                kind = "a GraphConst" if marker is Kind.GRAPHCONST else "a Host"
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
        if self._run_config.eval_weights == "ema" and self._ema is not None:
            return self._ema
        return self._params

    def _sync_scheduled_devices(self) -> None:
        """Write the scheduled Device fields' current values into the experiment,
        so evaluation between epochs sees what training last used."""
        from ..optim.plan import scheduled_devices

        if not self._device_schedules:
            return
        assert self._plan is not None
        current = self._plan.schedule_values(max(self._step - 1, 0))
        updates = scheduled_devices(current, self._device_schedules, jnp.asarray)
        self._experiment = replace_fields(self._experiment, **updates)
        self._device_values = {**self._device_values, **updates}

    def set_phase(self, phase: phases.Phase, **info: Any) -> None:
        """Record `phase` and publish it to the monitors (a repeat is a no-op).

        The first Terminal phase releases the data sources, after the monitors ran.
        """
        if self.phase_recorder.set(phase, **info) and isinstance(
            phase, phases.Terminal
        ):
            self._release(f"the end of train() (phase {type(phase).__name__})")

    def release(self) -> None:
        """Release every split's source (its `release()` method), once per handle.

        Training does this itself when it ends; call it for a handle that only
        validated, predicted or exported. A split whose release raises is warned
        about and the others are still released. The handle cannot read a released
        source again: `train`, `validate`, `evaluate` and `render` refuse it.
        """
        self._release("nitro.release()")

    def _release(self, by: str) -> None:
        if self._released_by is None:
            self._released_by = by
            release_splits(self.data)

    def _refuse_released(self, verb: str, splits: Iterable[str]) -> None:
        """Refuse, before any stream opens, to read a split whose source was released.

        A source without a `release()` method held nothing open, so it stays readable.
        """
        if self._released_by is None:
            return
        for name in splits:
            if name in self.data and has_release(self.data[name]):
                kind = type(unwrap_source(self.data[name])).__name__
                raise ConfigError(
                    RELEASED_REFUSAL.format(
                        verb=verb, name=name, kind=kind, by=self._released_by
                    )
                )

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
        named = kwargs.get("preset")
        if named is not None and named not in presets(type(experiment)):
            raise ConfigError(
                f"preset={named!r}: {type(experiment).__name__} declares no such "
                f"preset, and the name is logged and stored in checkpoints as the "
                f"recipe this run used. Its presets: "
                f"{', '.join(presets(type(experiment))) or 'none'}."
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
    # `checkpoint` is the deprecated spelling of `weights`: a run keyword too.
    run_kw = {k: v for k, v in kwargs.items() if k in RUN_KEYWORDS or k == "checkpoint"}
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


RunHandle.register(Nitro)


def train(experiment: Any, preset: str | None = None, /, **kwargs: Any) -> Nitro:
    """`Nitro(experiment, **kwargs).train()`: build a handle and train it.

    One entry point: Idle is announced once, when training returns, not between the
    setup and the training.
    """
    with entry_point():
        if preset is None:
            return Nitro(experiment, **kwargs).train()
        return Nitro(experiment, preset, **kwargs).train()
