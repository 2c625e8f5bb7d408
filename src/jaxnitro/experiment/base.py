"""`Experiment`: the base class that turns a class with marked fields into a run config.

A subclass becomes a frozen, keyword-only dataclass registered as a JAX pytree (its
Device fields are the children). It records its fields' markers as the three traits
`device_fields`, `host_fields` and `config_metadata`, and it carries the run accessors
(`seed`, `accum`, `max_epochs`, ...) with their defaults, which a subclass overrides
with a method or with a field of the same name (inherited from `RunAccessors`,
`run_accessors.py`), and the export hooks' defaults (`ExportHooks`,
`export_hooks.py`). Its docstring gains a marker table (field, kind, type, default,
doc; `field_table.py`), so `help(MyExp)` shows every field at a glance.

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
import sys
import typing
from typing import Any, ClassVar

import jax

from ..errors import ConfigError, HookError
from ..watch import did_you_mean
from .export_hooks import ExportHooks
from .field_table import marker_table, summarize
from .fielddocs import read_field_sources
from .markers import DEVICE_MARKER, GRAPHCONST_MARKER, HOST_MARKER, Kind, field_kind
from .ranges import check_bounds, check_in_range
from .record_name import checkpoint_filename
from .run_accessors import RunAccessors
from .traits import NO_DEFAULT, FieldMeta
from .values import coerce_graphconst, freeze_graphconst

# The base learning rate of the default optimizer (radam) when nothing sets one.
DEFAULT_LEARNING_RATE = 1e-3


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


class Experiment(RunAccessors, ExportHooks):
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
        table = marker_table(cls)
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
