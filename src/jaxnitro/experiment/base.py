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

from ..errors import ConfigError
from ..watch import did_you_mean
from .fielddocs import read_field_sources
from .markers import DEVICE_MARKER, GRAPHCONST_MARKER, HOST_MARKER, Kind, field_kind
from .traits import NO_DEFAULT, FieldMeta
from .values import coerce_graphconst, freeze_graphconst


def field(
    *,
    default: Any = dataclasses.MISSING,
    default_factory: Any = dataclasses.MISSING,
    doc: str | None = None,
) -> Any:
    """Declare a field with a default factory or a docstring.

    Example:
        >>> import numpy as np
        >>> from jaxnitro import Device, Experiment, field
        >>> class E(Experiment):
        ...     weights: Device[np.ndarray] = field(
        ...         default_factory=lambda: np.ones(3, np.float32), doc="Class weights."
        ...     )
        >>> E.config_metadata()["weights"].doc
        'Class weights.'
    """
    metadata = {"jaxnitro_doc": doc} if doc is not None else {}
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

    Subclasses are frozen keyword-only dataclasses. Mark each field `GraphConst[T]`,
    `Device[T]` or `Host[T]`; an unmarked field is Host. Define the four required hooks
    `build_model`, `build_data`, `forward` and `loss`; every other hook and accessor
    has a default here, overridden by a method or by a field of the same name.
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

    # --- traits ----------------------------------------------------------------------
    @classmethod
    def device_fields(cls) -> tuple[str, ...]:
        """The Device fields, in declaration order."""
        return tuple(n for n, m in cls._jaxnitro_meta.items() if m.kind == "device")

    @classmethod
    def host_fields(cls) -> tuple[str, ...]:
        """The Host fields (unmarked ones included), in declaration order."""
        return tuple(n for n, m in cls._jaxnitro_meta.items() if m.kind == "host")

    @classmethod
    def config_metadata(cls) -> dict[str, FieldMeta]:
        """One `FieldMeta` (type, default, kind, doc, line) per field."""
        return dict(cls._jaxnitro_meta)

    @classmethod
    def presets(cls) -> dict[str, dict[str, Any]]:
        """Named configurations: preset name -> partial field values. Default none."""
        return {}

    def __repr__(self) -> str:
        parts = [
            f"{name}={summarize(getattr(self, name, NO_DEFAULT))}"
            for name in type(self)._jaxnitro_meta
        ]
        return f"{type(self).__name__}({', '.join(parts)})"

    # --- run accessors: a keyword beats a subclass method or field, which beats these
    def seed(self) -> int:
        """The global RNG seed, set before build_data."""
        return 42

    def run_dir(self) -> str:
        """The run's output directory: runs/<experiment class name>."""
        return os.path.join("runs", type(self).__name__)

    def n_devs(self) -> int:
        """Local devices to shard the batch over."""
        return 1

    def accum(self) -> int:
        """Micro-batches per optimizer step; baked into the gradient program."""
        return 1

    def max_epochs(self) -> int:
        """Epochs to train for."""
        return 1

    def gradient_clip_norm(self) -> float:
        """Global-norm clip threshold of the accumulated gradient; 0 is off."""
        return 0.0

    def check_divergence(self) -> bool:
        """Whether a non-finite training loss stops the run."""
        return True

    def log_every_n_steps(self) -> int:
        """Write the train line only on optimizer steps that are a multiple of this."""
        return 1

    def autolog_schedules(self) -> bool:
        """Whether varying schedule values are logged on the train line."""
        return True

    def eval_loss(self) -> bool:
        """Whether evaluation also reports the loss when custom metrics are defined."""
        return False

    def monitor(self) -> tuple[str, str] | None:
        """The validation metric the run is judged by, as (name, "min" | "max")."""
        return None

    def logger(self) -> Any:
        """The run's logger; the default writes metrics.jsonl in run_dir."""
        from ..logging.jsonl import JSONLogger

        return JSONLogger()

    def checkpointer(self) -> Any:
        """The run's checkpointer; the default keeps the best 3 and the latest."""
        from ..checkpoint.checkpointer import Checkpointer

        return Checkpointer()

    def early_stop(self) -> Any:
        """The early-stopping rule; default none."""
        return None

    def ema(self) -> Any:
        """The exponential moving average of the weights; default none."""
        return None

    def schedules(self) -> dict[str, Any]:
        """Values that vary with the optimizer step; default none."""
        return {}

    def learning_rate(self, group: str | None = None) -> float:
        """The base learning rate of the default optimizer."""
        return 1e-3

    def metrics_residency(self, hook: str) -> str:
        """Where a metric hook runs: "host" for metrics, "device" for train_metrics."""
        return "device" if hook == "train_metrics" else "host"

    def derive(self, data: Any) -> dict[str, Any]:
        """Field values computed from the data, merged before device conversion."""
        return {}

    def finalize_metrics(self, acc: dict[str, Any], split: str) -> dict[str, Any]:
        """Turn one split's combined metrics into the reported values; the identity."""
        return acc


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
