"""`Experiment`: the base class that turns a class with marked fields into a run config.

A subclass becomes a frozen, keyword-only dataclass registered as a JAX pytree (its
Device fields are the children). It records its fields' markers as the three traits
`device_fields`, `host_fields` and `config_metadata`, and it carries the run accessors
(`seed`, `accum`, `max_epochs`, ...) with their defaults, which a subclass overrides
with a method or with a field of the same name. Its docstring gains a marker table
(field, kind, type, default, doc), so `help(MyExp)` shows every field at a glance.

    class MnistMLP(Experiment):
        width: GraphConst[int] = 128
        \"\"\"Hidden width. Structural: changes the compiled graph.\"\"\"
        smoothing: Device[float] = 0.05
        max_epochs: int = 5

        def build_model(self, rng): ...
        def build_data(self, dist): ...
        def forward(self, model, params, state, *, img): ...
        def loss(self, outputs, *, label): ...
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import sys
import typing
from typing import Any, ClassVar

import jax
import numpy as np

from ..errors import ConfigError, HookError
from ..watch import did_you_mean
from .fielddocs import read_field_sources
from .markers import DEVICE_MARKER, GRAPHCONST_MARKER, HOST_MARKER, Kind, field_kind
from .ranges import check_bounds, check_in_range
from .record_name import checkpoint_filename
from .traits import NO_DEFAULT, FieldMeta
from .values import coerce_graphconst, freeze_graphconst

# The base learning rate of the default optimizer (radam) when nothing sets one.
DEFAULT_LEARNING_RATE = 1e-3

# The train line's default thinning: Lightning's default (the spec says 1).
DEFAULT_LOG_EVERY_N_STEPS = 50


class _RunDefault:
    """The type of `RUN_DEFAULT`: one instance, compared by identity."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "RUN_DEFAULT"


# What `logger()` and `checkpointer()` return when the experiment keeps the base's:
# "the run's default". The classes live in layers above the experiment (logging/,
# checkpoint/), so the run makes them (`jaxnitro.run.defaults`).
RUN_DEFAULT: Any = _RunDefault()


def field(
    *,
    default: Any = dataclasses.MISSING,
    default_factory: Any = dataclasses.MISSING,
    doc: str | None = None,
    ge: float | None = None,
    le: float | None = None,
) -> Any:
    """Declare a field with a default, a default factory, a docstring or a range.

    Use it where a plain default will not do: a mutable or array default needs a
    factory, and `doc` documents a field where an attribute docstring cannot sit.

    Args:
        default: the field's default value; omit both it and `default_factory` for
            a required field.
        default_factory: a zero-argument callable that makes the default, called
            once per instance (e.g. `lambda: np.zeros(3, np.float32)`).
        doc: the field's docstring; it wins over a string literal under the field,
            and shows in `config_metadata()` and in the class's marker table.
        ge: the smallest value the field takes (a number), or None for no bound.
            Constructing the experiment with a smaller number raises ConfigError,
            and so does a value that is not a number (a traced array is let
            through). The agent tools check it before a run starts.
        le: the largest value the field takes, or None for no bound.

    Returns:
        A `dataclasses.field` carrying `doc` in its metadata, for the class body.

    Raises:
        ValueError: both `default` and `default_factory` were given (raised by
            `dataclasses.field`).
        ConfigError: `ge` or `le` is not a real number, or `ge` > `le`.

    Examples:
        >>> import numpy as np
        >>> from jaxnitro import Device, Experiment, field
        >>> class E(Experiment):
        ...     weights: Device[np.ndarray] = field(
        ...         default_factory=lambda: np.ones(3, np.float32), doc="Class weights."
        ...     )
        >>> E.config_metadata()["weights"].doc
        'Class weights.'
    """
    metadata: dict[str, Any] = {"jaxnitro_doc": doc} if doc is not None else {}
    if ge is not None or le is not None:
        metadata["jaxnitro_range"] = check_bounds(ge, le)
    return dataclasses.field(
        default=default, default_factory=default_factory, metadata=metadata
    )


def _resolve_annotations(cls: type) -> dict[str, Any]:
    """The class's own annotations, resolved where possible, strings otherwise."""
    own = cls.__dict__.get("__annotations__", {})
    module = sys.modules.get(cls.__module__)
    namespace = dict(vars(module)) if module is not None else {}
    namespace.update(
        GraphConst=typing.Annotated[typing.Any, GRAPHCONST_MARKER],
        Device=typing.Annotated[typing.Any, DEVICE_MARKER],
        Host=typing.Annotated[typing.Any, HOST_MARKER],
    )
    try:
        hints = typing.get_type_hints(cls, include_extras=True)
        return {name: hints.get(name, own[name]) for name in own}
    except Exception:
        resolved = {}
        for name, annotation in own.items():
            if isinstance(annotation, str):
                try:
                    module_ns = dict(vars(module)) if module is not None else {}
                    annotation = eval(annotation, module_ns, dict(vars(cls)))
                except Exception:
                    pass
            resolved[name] = annotation
        return resolved


class Experiment:
    """Base class of experiments: marked fields plus hooks, with accessor defaults.

    Subclasses are frozen keyword-only dataclasses, registered as JAX pytrees whose
    children are the Device fields. Mark each field `GraphConst[T]` (structural: a
    trace-time constant in the compile cache key), `Device[T]` (a traced input,
    placed on the device at setup and changeable without recompiling) or `Host[T]`
    (driver-only, never traced); an unmarked field is Host. A GraphConst list
    becomes a tuple, and a GraphConst value converts to its declared type when that
    keeps its value (3.0 to a declared int). A subclass's docstring gains a table of
    its fields (field, kind, type, default, doc), the doc being the string literal
    under the field or `field(doc=...)`.

    Define the four required hooks `build_model`, `build_data`, `forward` and
    `loss`. The run accessors (`seed`, `accum`, `max_epochs`, ...) and the hooks
    `derive`, `finalize_metrics`, `learning_rate` and `metrics_residency` have
    defaults here, overridden by a method of the same name or, for a run accessor
    and `learning_rate`, by a field (for a run accessor, a `Nitro` keyword of that
    name beats both).
    `schedules` reads no field: a field of that name is refused at setup.

    The required hooks, each called with the experiment as `self`:

    * `build_data(self, dist) -> {split: source}`: the named data collection,
      such as `{"train": ..., "val": ...}`. A source is a sized, restartable
      iterable of batch dicts, each field an array of shape (batch, ...), batch
      axis first; the train split drops its partial last batch. `dist` is None
      today. It sees the experiment before device conversion, and does not run
      when `Nitro(e, data=...)` supplies the collection.
    * `build_model(self, rng) -> (model, params, state)`: `rng` is
      `jax.random.key(seed)`; params and state are pytrees of arrays (`{}` for a
      stateless model); model is passed back to `forward` as it is.
    * `forward(self, model, params, state, *, <fields>) -> (outputs, new_state)`:
      declares the batch fields it reads as keyword arguments (a default makes
      one optional). Every output leaf has the batch axis first, shape
      (batch, ...); return `state` unchanged for a stateless model.
    * `loss(self, outputs, *, <fields>) -> scalar or (scalar, {term: scalar})`:
      the scalar differentiated; each term is logged as `loss/<term>`.

    Optional hooks with no default here: `metrics`, `train_metrics`,
    `param_group`, `optimizer`, `weight_decay`, `decay_anchor`, `no_decay`,
    `grad_rule`, `no_perturb`, `adaptive_perturb`, `visualize`, `save_figure`.

    The export hooks (`export_inputs`, `export_outputs`, `export_preprocess`,
    `export_postprocess`, `export_client_inputs`, `export_client_outputs`,
    `export_provenance_extra`) have defaults here too; `export_inputs` and
    `export_outputs` raise, naming the fix, since `export_model` needs them.

    Keyword Args:
        **fields: the field values, by keyword; a field without a default must be
            given.

    Raises:
        ConfigError: a keyword that names no field (the message suggests the near
            spelling); a GraphConst value that does not convert to its declared
            type without loss.
        TypeError: a field without a default is missing (the dataclass
            constructor's error).

    Examples:
        >>> import jaxnitro as nx
        >>> class Sketch(nx.Experiment):
        ...     width: nx.GraphConst[int] = 128
        ...     smoothing: nx.Device[float] = 0.05
        ...     max_epochs: int = 5  # unmarked, so Host; overrides the accessor
        >>> Sketch.device_fields(), Sketch.host_fields()
        (('smoothing',), ('max_epochs',))
        >>> Sketch(width=64.0)  # converted to the declared int
        Sketch(width=64, smoothing=0.05, max_epochs=5)
        >>> Sketch(widht=64)
        Traceback (most recent call last):
        ...
        jaxnitro.errors.ConfigError: Sketch has no field `widht` (got widht=64). ...
    """

    _jaxnitro_meta: ClassVar[dict[str, FieldMeta]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own_doc = cls.__dict__.get("__doc__")  # before dataclass writes a signature
        annotations = _resolve_annotations(cls)
        kinds = {name: field_kind(a) for name, a in annotations.items()}
        for name, kind in kinds.items():
            default = cls.__dict__.get(name, dataclasses.MISSING)
            if kind.kind is Kind.GRAPHCONST and isinstance(default, list):
                setattr(cls, name, freeze_graphconst(default))
            elif default is dataclasses.MISSING and hasattr(cls, name):
                # A required field named like an accessor (`seed: int`): without this,
                # dataclasses would take the inherited method as the field's default.
                setattr(cls, name, dataclasses.field())
        dataclasses.dataclass(frozen=True, kw_only=True, repr=False)(cls)
        cls.__init__ = _checked_init(cls, cls.__init__)  # type: ignore[method-assign]

        sources = read_field_sources(cls)
        inherited = {
            name: meta
            for base in reversed(cls.__mro__[1:])
            for name, meta in getattr(base, "_jaxnitro_meta", {}).items()
        }
        meta: dict[str, FieldMeta] = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if f.name not in kinds:
                meta[f.name] = inherited[f.name]
                continue
            if f.default is not dataclasses.MISSING:
                default = f.default
            elif f.default_factory is not dataclasses.MISSING:
                default = f.default_factory
            else:
                default = NO_DEFAULT
            source = sources.get(f.name)
            doc = f.metadata.get("jaxnitro_doc") or (source.doc if source else None)
            meta[f.name] = FieldMeta(
                type=kinds[f.name].inner,
                default=default,
                kind=kinds[f.name].kind.value,
                doc=doc,
                line=source.line if source else 0,
                ge=f.metadata.get("jaxnitro_range", (None, None))[0],
                le=f.metadata.get("jaxnitro_range", (None, None))[1],
            )
        cls._jaxnitro_meta = meta
        table = _marker_table(cls)
        cls.__doc__ = f"{inspect.cleandoc(own_doc)}\n\n{table}" if own_doc else table
        jax.tree_util.register_pytree_with_keys(
            cls, _flatten_with_keys, _unflattener(cls), _flatten
        )

    def __post_init__(self) -> None:
        for name, meta in type(self)._jaxnitro_meta.items():
            if meta.kind == Kind.GRAPHCONST.value:
                value = coerce_graphconst(name, meta.type, getattr(self, name))
                object.__setattr__(self, name, value)
            if meta.ge is not None or meta.le is not None:
                check_in_range(type(self).__name__, name, meta, getattr(self, name))

    # --- traits ----------------------------------------------------------------------
    @classmethod
    def device_fields(cls) -> tuple[str, ...]:
        """The Device fields, in declaration order.

        Returns:
            tuple[str, ...]: their names; inherited fields come first.
        """
        return tuple(n for n, m in cls._jaxnitro_meta.items() if m.kind == "device")

    @classmethod
    def host_fields(cls) -> tuple[str, ...]:
        """The Host fields (unmarked ones included), in declaration order.

        Returns:
            tuple[str, ...]: their names; inherited fields come first.
        """
        return tuple(n for n, m in cls._jaxnitro_meta.items() if m.kind == "host")

    @classmethod
    def config_metadata(cls) -> dict[str, FieldMeta]:
        """One `FieldMeta` (type, default, kind, doc, line) per field.

        Returns:
            dict[str, FieldMeta]: field name to its entry, in declaration order (a
            copy: changing it changes nothing).
        """
        return dict(cls._jaxnitro_meta)

    @classmethod
    def presets(cls) -> dict[str, dict[str, Any]]:
        """Named configurations: preset name -> partial field values. Default none.

        Override it as a classmethod. `from_preset(E, name, **overrides)` and
        `Nitro(E, name, ...)` build from an entry; every key must name a field.

        Returns:
            dict[str, dict[str, Any]]: preset name to the field values it sets.
        """
        return {}

    def __repr__(self) -> str:
        parts = [
            f"{name}={summarize(getattr(self, name, NO_DEFAULT))}"
            for name in type(self)._jaxnitro_meta
        ]
        return f"{type(self).__name__}({', '.join(parts)})"

    # --- run accessors: a keyword beats a subclass method or field, which beats these
    def seed(self) -> int:
        """The global RNG seed, set before build_data.

        Setup seeds Python's `random` and NumPy's global RNG with it (NumPy's modulo
        2**32) before `build_data`, and passes `jax.random.key(seed)` to
        `build_model`. A resume takes the record's seed instead. A `seed` field
        must not be GraphConst (setup refuses it), so a seed sweep shares one
        compiled program.

        Returns:
            int: 42.
        """
        return 42

    def run_dir(self) -> str:
        """The run's output directory: runs/<experiment class name>.

        Relative to the working directory. Checkpoints, the manifest, the default
        log file and `resume="auto"` resolve against it.

        Returns:
            str: `os.path.join("runs", type(self).__name__)`.
        """
        return os.path.join("runs", type(self).__name__)

    def n_devs(self) -> int:
        """Local devices to shard the batch over (the global batch splits across
        them, so it must divide by n_devs); 1 runs on one device without a mesh.

        A `setup_devices(n_devs=...)` pin beats this accessor, and the `n_devs`
        keyword of `Nitro` beats both. At most the visible devices.

        Returns:
            int: 1.
        """
        return 1

    def accum(self) -> int:
        """Micro-batches per optimizer step; baked into the gradient program.

        Setup refuses a value that is not an int >= 1, and a train split whose
        batch count does not divide by it (`ConfigError`). With accum = N each
        optimizer step accumulates the gradients of N micro-batches.

        Returns:
            int: 1.
        """
        return 1

    def max_epochs(self) -> int:
        """Epochs to train for: the epoch `train()` ends at.

        Setup refuses a value that is not an int >= 0, and a `max_epochs` field
        marked GraphConst (`ConfigError`).

        Returns:
            int: 1.
        """
        return 1

    def max_steps(self) -> int | None:
        """Optimizer steps to train for in all, or None for no step bound.

        Counted over the whole run, a resume included: training ends after step
        `max_steps`, mid-epoch if it falls there (that part-epoch is validated,
        checkpointed and gets its history row; stop_reason "completed"), or at
        `max_epochs`, whichever comes first. When `max_epochs` is left at its
        default (no keyword, method or field sets it), max_steps alone bounds the
        run: setup sets max_epochs to the epochs it needs. The schedules' horizon
        is min(max_steps, max_epochs * steps per epoch). Setup refuses a value that
        is not an int >= 1.

        Returns:
            None.
        """
        return None

    def gradient_clip_norm(self) -> float:
        """Global-norm clip threshold of the accumulated gradient; 0 is off.

        Applied to the fully accumulated gradient at the start of the optimizer
        step. It must be finite and >= 0.

        Returns:
            float: 0.0.
        """
        return 0.0

    def check_divergence(self) -> bool:
        """Whether a non-finite training loss stops the run.

        When True, a NaN or infinite loss raises `DivergenceError` naming its step
        and epoch; when False, training continues from the diverged state.

        Returns:
            bool: True.
        """
        return True

    def log_every_n_steps(self) -> int:
        """Write the train line only on optimizer steps that are a multiple of this.

        Only the writing is thinned: the loss is still read back every micro-batch
        for the divergence check and the history, and validation and the per-epoch
        lines are unaffected. Setup refuses a value that is not an int >= 1.

        Whatever the cadence, every epoch (and the part of one a stop or max_steps
        cut) ends with a train summary line, context "train_epoch", at its last
        step: the epoch's mean loss (the history's `train_loss`) and each
        train_metrics value averaged over the epoch's optimizer steps (the mean of
        the values their train lines would carry; after a resume mid-epoch, over
        the steps trained since). A run shorter than this many steps still logs
        its training.

        The default, 50, departs from the spec's 1 (a train line on every optimizer
        step): a line every step cost a dispatch-bound step about 9%
        (benchmarks/logger_cost.py), so it is 50, as in PyTorch Lightning. Return 1
        (or pass `log_every_n_steps=1`) for a line every step.

        Returns:
            int: 50 (`DEFAULT_LOG_EVERY_N_STEPS`).
        """
        return DEFAULT_LOG_EVERY_N_STEPS

    def val_every_n_steps(self) -> int | None:
        """Validate also after every optimizer step that is a multiple of this.

        Such a validation runs mid-epoch, where the step falls (an epoch's last
        step validates at the epoch end, once); the epoch-end validation stays.
        Each one writes a validate line and updates every Plateau and the
        early-stopping policy, so their patience counts validations, not epochs;
        the history keeps one row per epoch. The validation a stop or max_steps
        adds mid-epoch counts only when its step is such a multiple, so a stopped
        and resumed run decides as a straight one. Setup refuses a value that is
        not an int >= 1, and one given without a val split.

        Returns:
            None: validate at epoch ends only.
        """
        return None

    def checkpoint_every_n_steps(self) -> int | None:
        """Write a checkpoint record also after every optimizer step that is a
        multiple of this.

        A record written mid-epoch holds where the epoch stands (its batches and
        running train loss), so a resume from it continues that epoch at the exact
        batch and reproduces a straight run bitwise. It carries the validation
        metrics of its step when a validation ran there, else none (a ranking
        selector leaves it unscored). The manifest keeps one record per epoch of a
        run, so a later record of the same epoch replaces it. Setup refuses a value
        that is not an int >= 1.

        Returns:
            None: checkpoint at epoch ends only.
        """
        return None

    def autolog_schedules(self) -> bool:
        """Whether varying schedule values are logged on the train line.

        Returns:
            bool: True.
        """
        return True

    def eval_loss(self) -> bool:
        """Whether evaluation also reports the loss when custom metrics are defined.

        When True, each eval batch also runs `loss` in its own compiled program, and
        `loss` and each `loss/<term>` join what `finalize_metrics` returns, averaged
        over batches; a split whose batches lack the fields `loss` declares is
        skipped. Without `metrics` the loss is reported anyway.

        Returns:
            bool: False.
        """
        return False

    def monitor(self) -> tuple[str, str] | None:
        """The validation metric the run is judged by, as (name, "min" | "max").

        The checkpointer, early stopping and every Plateau follow it unless given
        their own metric and mode. The name is a key of the validation metrics
        (the validation loss is "loss"); "val_loss" is read as "loss" with a
        `DeprecationWarning`. None becomes ("loss", "min") at setup when the
        experiment defines no `metrics` or `eval_loss` is on. Otherwise there is no
        monitor, and setup refuses what would follow it: a checkpointer without a
        metric of its own that keeps Best checkpoints (on a handle with a val
        split), an EarlyStopping or a Plateau without their own metric.

        Returns:
            tuple[str, str] | None: None.
        """
        return None

    def logger(self) -> Any:
        """The run's logger; the default writes metrics.jsonl in run_dir.

        Called once per construction (not at all when the `logger` keyword is
        given), so a side effect in an override happens once per `Nitro`. Return
        None to log nothing.

        Returns:
            RUN_DEFAULT: the run's default, which setup makes (`jaxnitro.run.
            defaults`): a new `JSONLogger` pointed at `<run_dir>/metrics.jsonl`.
            An override may return `super().logger()` for the same.
        """
        return RUN_DEFAULT

    def checkpointer(self) -> Any:
        """The run's checkpointer; the default keeps the best 3 and the latest.

        Called once per construction (not at all when the `checkpointer` keyword
        is given). Return None to write no checkpoints.

        Returns:
            RUN_DEFAULT: the run's default, which setup makes (`jaxnitro.run.
            defaults`): a new `Checkpointer()`, `keep=(Best(3), Last(1))`,
            ranking by the monitor.
        """
        return RUN_DEFAULT

    def checkpoint_filename(
        self,
        *,
        epoch: int,
        step: int,
        metric: str | None = None,
        score: float | None = None,
        **names: Any,
    ) -> str:
        """The filename of a checkpoint record; a hook an experiment may redefine.

        A `Checkpointer` built without `name=` is bound to this hook at setup and
        looks it up at every write, so a method redefined on the class names the
        next record of a live run. The record suffix (".safetensors") is appended
        when the name lacks it; the name must not contain a directory. Setup calls
        it once with sample values, so a hook that fails fails before training. It
        is a method, never a field: a field of this name is refused at setup.

        Args:
            epoch: the epoch the record is written after (1-based).
            step: the optimizer step count.
            metric: the metric the record is scored by, or None (no val split).
            score: its value, or None.
            **names: keywords added later; accept them so a new one is no error.

        Returns:
            str: `jaxnitro.checkpoint_filename(...)` by default, such as
            "epoch-0006-step-4500-loss=0.0416831.safetensors".

        Example::

            class MyExp(nx.Experiment):
                def checkpoint_filename(self, *, epoch, score=None, **names):
                    return f"e{epoch:04d}_{score or 0.0:.4f}.safetensors"
        """
        return checkpoint_filename(epoch=epoch, step=step, metric=metric, score=score)

    def early_stop(self) -> Any:
        """The early-stopping rule; default none.

        An `EarlyStopping`, or any object with `should_stop(epoch, metrics) ->
        bool`, checked once per epoch after validation; setup refuses one on a
        handle that has a train split and no val split.

        Returns:
            None: the run never stops early.
        """
        return None

    def ema(self) -> Any:
        """The exponential moving average of the weights; default none.

        Return an `EMA(beta)` to keep one; validation, checkpoint selection and
        `predict` then read it (see the `eval_weights` keyword).

        Returns:
            None: no EMA.
        """
        return None

    def schedules(self) -> dict[str, Any]:
        """Values that vary with the optimizer step; default none.

        Each entry maps a key (an optimizer rule field such as "learning_rate", a
        Device field, a gradient rule field) to a factory of the horizon (called
        once with `total = max_epochs * (len(train) // accum)`, returning `step ->
        value`), a schedule, a bare number or a `Plateau`. It reads no field of the
        experiment: a field named `schedules` is refused.

        Returns:
            dict[str, Any]: an empty dict.
        """
        return {}

    def learning_rate(self, group: str | None = None) -> float:
        """The base learning rate of the default optimizer.

        A subclass's method (or a `learning_rate` field, one value for every group)
        replaces it. Called without a group, or with "default", it is the base
        rate; with another group it gives that group's rate, applied as a ratio
        against the base so that a learning-rate schedule scales every group. The
        base must be finite and > 0.

        Args:
            group: the parameter group's name (see `param_group`), or None.

        Returns:
            float: 1e-3, for every group.
        """
        return DEFAULT_LEARNING_RATE

    def metrics_residency(self, hook: str) -> str:
        """Where a metric hook runs: "host" for metrics, "device" for train_metrics.

        "host" calls the hook on NumPy arrays outside any program; "device" traces
        it into a compiled program, on device arrays. Read once per hook and frozen
        with the handle; any other value raises `ConfigError`.

        Args:
            hook: "metrics" or "train_metrics".

        Returns:
            str: "device" for "train_metrics", "host" otherwise.
        """
        return "device" if hook == "train_metrics" else "host"

    def manual_training(self) -> bool:
        """Whether `train()` runs manual mode: the experiment's own `train_step`.

        Read once at construction and frozen with the handle. Override it to return
        False to keep a `train_step` method in source while using the automatic
        loop.

        Returns:
            bool: whether the experiment's class defines `train_step`.
        """
        return any(
            "train_step" in klass.__dict__
            for klass in type(self).__mro__
            if klass is not Experiment and klass is not object
        )

    def setup_optimizers(self, model: Any, params: Any, state: Any, mesh: Any) -> Any:
        """Manual mode: the optimizer states, typically one per network.

        Called once at construction, after `build_model`. Build each network's state
        with `jaxnitro.setup_optimizer(tx, params_subtree)`; the framework places the
        result on the device and refuses a host Python number in any leaf (a step
        counter would freeze under trace), naming its key path. `train_step`
        receives the tree as `opt_state` and returns its successor.

        Args:
            model: the static model `build_model` returned.
            params: the parameter tree.
            state: the model state.
            mesh: the device mesh; None on a single device.

        Returns:
            Any: a tree of `OptState`s, e.g. `{"gen": ..., "disc": ...}`. The
            default raises: a manual experiment must define it.
        """
        del model, params, state, mesh
        raise HookError(
            f"{type(self).__name__} trains in manual mode (it defines train_step) "
            f"but does not define setup_optimizers(self, model, params, state, "
            f"mesh). Return one state per network, e.g. "
            f'{{"gen": jaxnitro.setup_optimizer(optax.adam(1e-4), params["gen"])}}, '
            f"or make manual_training() return False to use the automatic loop."
        )

    def derive(self, data: Any) -> dict[str, Any]:
        """Field values computed from the data, merged before device conversion.

        Runs once at setup, after `build_data` and before the Device fields are
        placed, on the experiment as constructed (Device fields hold host values).
        A `weights=` load from a record that lists its derived keys skips it and
        restores those values from the record instead.

        Args:
            data: the split collection, `{name: source}`, as `build_data` returned
                it (or as `data=` passed it).

        Returns:
            dict[str, Any]: field name to value; every key must name a field. The
            default derives nothing.
        """
        return {}

    def finalize_metrics(self, acc: dict[str, Any], split: str) -> dict[str, Any]:
        """Turn one split's combined metrics into the reported values; the identity.

        Runs on the host once per split per evaluation, after every batch. Use it
        for a metric that is not a mean of per-batch values (a macro recall from a
        summed confusion matrix), and to branch on the split.

        Args:
            acc: the split's metrics, in the shape `metrics` returns them, each
                combined across batches as its mode says: a `(value, count)` pair
                summed on both sides then divided (a float64), "sum" summed (an
                integer sum stays int64), "concat" concatenated along the batch
                axis. Without a `metrics` hook, `{"loss": ...}` and the loss terms.
            split: the split's name, such as "val" or "test".

        Returns:
            dict[str, Any]: the reported metrics, name to a number or an array; a
            "concat" leaf must not come back unreduced. The default returns `acc`.
        """
        return acc

    # --- export (`jaxnitro.export_model`) ----------------------------------------
    def export_inputs(self) -> list[Any]:
        """The tensors a client sends, in order: a list of `ExportSpec`. Required
        for `export_model`; the default raises.

        The order fixes the positional order the program is traced with and the
        tensor names in the bundle. Each spec needs a dtype and a shape whose first
        axis is the batch (its size a placeholder for each exported batch size).

        Raises:
            HookError: always, naming the fix: define the method.
        """
        raise HookError(
            f"export_model needs {type(self).__name__}.export_inputs: the tensors a "
            "client sends. Define it, e.g. `def export_inputs(self): return "
            "[ExportSpec('x', 'float32', (1, 8))]` (batch axis first)."
        )

    def export_outputs(self) -> list[Any]:
        """Which leaves of `forward`'s outputs ship, and under what names: a list of
        `ExportSpec`. Required for `export_model`; the default raises.

        Each spec's source (`from_`, else its name) is a key of the dict `forward`
        returns, or a wire input (an echo, which must declare `from_`); a bare
        array output takes exactly one spec. dtype and shape come from the trace;
        when given they are checked against it, the batch axis excluded.

        Raises:
            HookError: always, naming the fix: define the method.
        """
        raise HookError(
            f"export_model needs {type(self).__name__}.export_outputs: which outputs "
            "of forward ship. Define it, e.g. `def export_outputs(self): return "
            "[ExportSpec('logits')]`."
        )

    def export_preprocess(self, *wire: Any) -> Any:
        """Convert the wire inputs into the batch `forward` takes; traced into the
        exported program, and also called eagerly on host arrays by the probe.

        Args:
            *wire: one array per `export_inputs` spec, in order, batch axis first.

        Returns:
            dict[str, Any] | None: the batch forward routes its keywords from. The
            default, None, makes each wire input the batch field of its own name.
        """
        del wire
        return None

    def export_postprocess(self) -> str | None:
        """Python source that ships in the bundle as `postprocess.py`, for work
        that does not belong in the compiled graph (a softmax, a decode). The
        framework never runs it. The default, None, ships none."""
        return None

    def export_client_inputs(self) -> list[Any] | None:
        """What a client sends before the postprocess's counterpart runs, when it
        differs from the wire inputs: a list of `ExportSpec` with dtype and shape
        (axis letters and -1 axes allowed). Refused without `export_postprocess`.
        The default, None, means the wire inputs."""
        return None

    def export_client_outputs(self) -> list[Any] | None:
        """What a client receives after `export_postprocess` has run, when it
        differs from what the program emits: a list of `ExportSpec` with dtype and
        shape. Refused without `export_postprocess`. The default is None."""
        return None

    def export_provenance_extra(
        self, *, checkpoint: str | None = None
    ) -> dict[str, Any]:
        """The model's own provenance entries, merged over the framework's and the
        site's (and under `export_model`'s `provenance` argument).

        Args:
            checkpoint: the file the weights came from (`nitro.checkpoint_source`),
                or None for fresh weights.

        Returns:
            dict[str, Any]: JSON-serializable entries; the default is empty.
        """
        del checkpoint
        return {}


def summarize(value: Any) -> str:
    """A short display of a field value: never a device buffer, never a big array."""
    if isinstance(value, jax.Array):
        shape = "x".join(map(str, value.shape))
        if value.ndim == 0 and not isinstance(value, jax.core.Tracer):
            return f"{value.dtype}[] on device"
        return f"{value.dtype}[{shape}] on device"
    if isinstance(value, np.ndarray):
        if value.size <= 8 and value.ndim <= 1:
            return repr(value.tolist())
        return f"{value.dtype}[{'x'.join(map(str, value.shape))}]"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _checked_init(cls: type, init: Any) -> Any:
    """The dataclass constructor, refusing an unknown keyword with the fields named
    (Python's own error names neither the fields nor a near spelling)."""
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    known = set(names)

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        unknown = [key for key in kwargs if key not in known]
        if unknown:
            key = unknown[0]
            raise ConfigError(
                f"{cls.__name__} has no field `{key}` (got {key}={kwargs[key]!r})."
                f"{did_you_mean(key, names)} Its fields: {', '.join(names) or 'none'}."
            )
        init(self, *args, **kwargs)

    return __init__


_KIND_NAMES = {"graphconst": "GraphConst", "device": "Device", "host": "Host"}


def _marker_table(cls: type) -> str:
    """The fields as an aligned text table (field, kind, type, default, doc)."""
    rows: list[tuple[str, ...]] = [("field", "kind", "type", "default", "doc")]
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        meta = cls._jaxnitro_meta[f.name]  # type: ignore[attr-defined]
        if f.default_factory is not dataclasses.MISSING:
            default = "<factory>"
        elif meta.default is NO_DEFAULT:
            default = "required"
        else:
            default = summarize(meta.default)
        rows.append(
            (
                f.name,
                _KIND_NAMES.get(meta.kind, meta.kind),
                _type_name(meta.type),
                default if len(default) <= 24 else default[:21] + "...",
                " ".join((meta.doc or "").split()),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    rows.insert(1, tuple("-" * w for w in widths) + ("-" * 3,))
    lines = [
        "    "
        + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False))
        + "  "
        + row[4]
        for row in rows
    ]
    return f"Fields of {cls.__name__}:\n\n" + "\n".join(line.rstrip() for line in lines)


def _type_name(annotation: Any) -> str:
    if annotation is None or annotation is typing.Any:
        return "Any"
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _flatten_with_keys(e: Any) -> tuple[list[tuple[Any, Any]], tuple[Any, ...]]:
    names = type(e).device_fields()
    children = [(jax.tree_util.GetAttrKey(n), getattr(e, n)) for n in names]
    static = tuple((n, getattr(e, n)) for n in type(e)._jaxnitro_meta if n not in names)
    return children, static


def _flatten(e: Any) -> tuple[list[Any], tuple[Any, ...]]:
    children, static = _flatten_with_keys(e)
    return [child for _, child in children], static


def _unflattener(cls: type) -> Any:
    def unflatten(static: tuple[Any, ...], children: Any) -> Any:
        instance: Any = object.__new__(cls)
        for name, value in static:
            object.__setattr__(instance, name, value)
        for name, value in zip(cls.device_fields(), children, strict=True):  # type: ignore[attr-defined]
            object.__setattr__(instance, name, value)
        return instance

    return unflatten


def defines(cls: type, name: str) -> bool:
    """Whether `cls` defines `name` itself, above the `Experiment` defaults."""
    for klass in cls.__mro__:
        if klass is Experiment or klass is object:
            return False
        if name in klass.__dict__:
            return True
    return False
