"""Data declarations (`loader`, `files`, `field`), evaluation passes and `defrun`.

These are declarations: `check` reads the shapes they declare and never opens a
data file. The loader that reads the records (JSON lines, gzip) lands in part 2
of the run file; its declaration is complete here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .bounds import (
    BATCH_ELEMENTS_MAX,
    BATCH_SIZE_MAX,
    BLOCKS_MAX,
    MICROBATCHES_MAX,
    SEED_MAX,
    STEPS_MAX,
    in_range,
)
from .core import expect
from .source import Diagnostic, Span, did_you_mean, fail
from .values import Builtin, Keyword, kind_of

DTYPES = {
    "i8": "int8",
    "i16": "int16",
    "i32": "int32",
    "i64": "int64",
    "u8": "uint8",
    "u16": "uint16",
    "u32": "uint32",
    "bool": "bool",
    "f16": "float16",
    "bf16": "bfloat16",
    "f32": "float32",
    "f64": "float64",
}
ENCODINGS = ("jsonl", "jsonl.gz")
PRECISIONS = ("f32", "bf16", "f16")


@dataclass(frozen=True)
class FilesSpec:
    """Data files of one encoding; paths relative to the run file."""

    paths: tuple[str, ...]
    encoding: str
    kind = "a files declaration"


@dataclass(frozen=True)
class FieldSpec:
    """One field of a record: its name, the record key, dtype and shape."""

    name: str
    source: str
    dtype: str  # a NumPy dtype name
    shape: tuple[int, ...]
    kind = "a field declaration"


@dataclass(frozen=True)
class LoaderSpec:
    """Where records come from and what one batch holds."""

    sources: tuple[FilesSpec, ...]
    fields: tuple[FieldSpec, ...]
    batch_size: int
    infinite: bool | None
    """`:infinite` as written (None: not written). A train loader streams its
    records pass after pass, whatever it says, and `check` refuses an explicit
    `:infinite false` on one (E-LOAD-012): a run is `:steps` long, not one pass."""
    infinite_at: Span | None = field(default=None, compare=False, repr=False)
    """Where `:infinite` was written."""
    kind = "a loader"

    def batch_shapes(self) -> dict[str, Any]:
        """Each field's `jax.ShapeDtypeStruct` of one batch, batch dimension first."""
        import jax
        import jax.numpy as jnp

        return {
            f.name: jax.ShapeDtypeStruct(
                (self.batch_size, *f.shape), jnp.dtype(f.dtype)
            )
            for f in self.fields
        }


@dataclass(frozen=True)
class Batch:
    """A batch as `prepare` sees it: read a field with `(field batch :name)`."""

    arrays: dict[str, Any]
    kind = "a batch"


@dataclass(frozen=True)
class EvalSpec:
    """An evaluation pass: its loader, how often it runs, how many batches."""

    loader: LoaderSpec
    every: int | None  # None: after every cadence block
    batches: int | None
    kind = "an evaluation pass"


@dataclass(frozen=True)
class RunSpec:
    """A run's steps, microbatches per step, cadence, precision and seed."""

    steps: int
    microbatches: int
    cadence: int
    precision: str
    seed: int
    kind = "a run"


def _positive(value: Any, what: str, span: Span) -> int:
    expect(value, int, what, span, "a positive integer")
    if value < 1:
        raise fail(
            "E-EVAL-007", f"{what} must be a positive integer, got {value}", span
        )
    return int(value)


def _files(values: list[Any], kwargs: dict[str, Any], span: Span) -> FilesSpec:
    paths = values[0] if isinstance(values[0], tuple) else (values[0],)
    for path in paths:
        expect(path, str, "a path of `files`", span.at(0), "a string")
        if "://" in path:
            raise fail(
                "E-LOAD-001",
                f"{path!r} is not a local path",
                span.at(0),
                "copy the data beside the run file; a run file reads no "
                "network location",
            )
    encoding = kwargs.get("encoding", "jsonl.gz")
    if encoding not in ENCODINGS:
        raise fail(
            "E-LOAD-002",
            f"unknown encoding {encoding!r} of `files`",
            span.at("encoding"),
            "use one of " + ", ".join(repr(e) for e in ENCODINGS),
        )
    return FilesSpec(tuple(paths), encoding)


def _field(values: list[Any], kwargs: dict[str, Any], span: Span) -> Any:
    if len(values) == 2 and not kwargs:
        batch, name = values
        if not isinstance(batch, Batch) or not isinstance(name, Keyword):
            raise fail(
                "E-EVAL-007",
                "(field batch :name) reads a batch's field, got "
                f"{kind_of(batch)} and {kind_of(name)}",
                span,
            )
        if name.name not in batch.arrays:
            raise fail(
                "E-LOAD-003",
                f"the batch has no field :{name.name} (it has "
                + " ".join(f":{k}" for k in batch.arrays)
                + ")",
                span.at(1),
                did_you_mean(name.name, batch.arrays)
                or "declare it in the loader's :fields",
            )
        return batch.arrays[name.name]
    if len(values) != 1 or not isinstance(values[0], Keyword):
        raise fail(
            "E-EVAL-004",
            "`field` is (field :name :dtype :i32 :shape [n]) or (field batch :name)",
            span,
        )
    for needed in ("dtype", "shape"):
        if needed not in kwargs:
            raise fail(
                "E-EVAL-006",
                f"`field` needs :{needed}",
                span,
                "write (field :tokens :dtype :i32 :shape [17])",
            )
    dtype = kwargs["dtype"]
    if not isinstance(dtype, Keyword) or dtype.name not in DTYPES:
        raise fail(
            "E-LOAD-004",
            f"unknown dtype {dtype} of field :{values[0].name}",
            span.at("dtype"),
            did_you_mean(str(getattr(dtype, "name", dtype)), DTYPES)
            or "one of " + " ".join(f":{d}" for d in DTYPES),
        )
    shape = kwargs["shape"]
    if not isinstance(shape, tuple) or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in shape
    ):
        raise fail(
            "E-LOAD-005",
            f"the shape of field :{values[0].name} must be a "
            f"vector of positive integers, got {shape}",
            span.at("shape"),
            "write :shape [17] (one record, no batch dimension)",
        )
    source = kwargs.get("from", values[0].name)
    expect(
        source,
        str,
        "`:from` of `field`",
        span.at("from"),
        "a string (the record's key)",
    )
    return FieldSpec(values[0].name, source, DTYPES[dtype.name], shape)


def _loader(values: list[Any], kwargs: dict[str, Any], span: Span) -> LoaderSpec:
    sources = kwargs["sources"]
    if (
        not isinstance(sources, tuple)
        or not sources
        or not all(isinstance(s, FilesSpec) for s in sources)
    ):
        raise fail(
            "E-LOAD-006",
            "`:sources` of `loader` must be a non-empty vector of (files ...)",
            span.at("sources"),
            ':sources [(files ["data/train.jsonl.gz"])]',
        )
    fields = kwargs["fields"]
    if (
        not isinstance(fields, tuple)
        or not fields
        or not all(isinstance(f, FieldSpec) for f in fields)
    ):
        raise fail(
            "E-LOAD-006",
            "`:fields` of `loader` must be a non-empty vector of (field ...)",
            span.at("fields"),
            ":fields [(field :tokens :dtype :i32 :shape [17])]",
        )
    names = [f.name for f in fields]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise fail(
            "E-LOAD-007",
            f"field :{twice[0]} is declared twice",
            span.at("fields"),
            "give each field its own name",
        )
    infinite = kwargs.get("infinite")
    if infinite is not None:
        expect(
            infinite,
            bool,
            "`:infinite` of `loader`",
            span.at("infinite"),
            "true or false",
        )
    batch_size = _positive(kwargs["batch-size"], "`:batch-size`", span.at("batch-size"))
    in_range(batch_size, "`:batch-size`", 1, BATCH_SIZE_MAX, span.at("batch-size"))
    for f in fields:
        elements = batch_size * math.prod(f.shape)
        if elements > BATCH_ELEMENTS_MAX:
            raise fail(
                "E-EVAL-007",
                f"field :{f.name} of shape {list(f.shape)} in batches of "
                f"{batch_size} holds {elements} elements a batch, over the bound "
                f"of {BATCH_ELEMENTS_MAX}",
                span.at("batch-size"),
                "use a smaller :batch-size or a smaller field :shape",
            )
    return LoaderSpec(
        sources,
        fields,
        batch_size,
        infinite,
        span.at("infinite") if infinite is not None else None,
    )


def finite_train_loader(
    loader: LoaderSpec, what: str, span: Span | None
) -> Diagnostic | None:
    """E-LOAD-012 when a loader that feeds training (`what`: `train-loader`, a
    curriculum stage's) says `:infinite false`, else None.

    A run is `:steps` optimizer steps long (defrun), and `check` reports them
    without opening a data file: a train loader that stopped after one pass would
    end the run at a step that depends on the record count, and the schedules
    (a decay over the run's steps) and the cadence blocks would be planned for
    steps that never come. So the train stream goes on pass after pass, each
    pass a new permutation, and `:infinite false` is refused, not ignored.
    """
    if loader.infinite is not False:
        return None
    return Diagnostic(
        "E-LOAD-012",
        f"{what} is :infinite false, but a run is defrun's :steps long: the train "
        "loader streams its records pass after pass (each a new order)",
        loader.infinite_at or span,
        "write :infinite true, or leave it out; for one pass over the records set "
        ":steps to records / (:batch-size x :microbatches)",
    )


def _eval_pass(values: list[Any], kwargs: dict[str, Any], span: Span) -> EvalSpec:
    loader = kwargs["loader"]
    if not isinstance(loader, LoaderSpec):
        raise fail(
            "E-EVAL-007",
            f"`:loader` of defeval must be a loader, got {kind_of(loader)}",
            span.at("loader"),
        )
    batches = kwargs.get("batches")
    every = kwargs.get("every")
    return EvalSpec(
        loader,
        None if every is None else _positive(every, "`:every`", span.at("every")),
        None
        if batches is None
        else _positive(batches, "`:batches`", span.at("batches")),
    )


def _defrun(values: list[Any], kwargs: dict[str, Any], span: Span) -> RunSpec:
    steps = _positive(kwargs["steps"], "`:steps` of defrun", span.at("steps"))
    precision = kwargs.get("precision", Keyword("f32"))
    if not isinstance(precision, Keyword) or precision.name not in PRECISIONS:
        raise fail(
            "E-EVAL-007",
            "`:precision` must be one of "
            + " ".join(f":{p}" for p in PRECISIONS)
            + f", got {precision}",
            span.at("precision"),
        )
    seed = kwargs.get("seed", 0)
    expect(seed, int, "`:seed` of defrun", span.at("seed"), "an integer")
    in_range(seed, "`:seed` of defrun", 0, SEED_MAX, span.at("seed"), SEED_WHY)
    microbatches = _positive(
        kwargs.get("microbatches", 1), "`:microbatches`", span.at("microbatches")
    )
    in_range(
        microbatches,
        "`:microbatches` of defrun",
        1,
        MICROBATCHES_MAX,
        span.at("microbatches"),
    )
    cadence = _positive(
        kwargs.get("cadence", max(1, steps // 10)), "`:cadence`", span.at("cadence")
    )
    check_steps(steps, cadence, span)
    return RunSpec(steps, microbatches, cadence, precision.name, seed)


SEED_WHY = (
    "JAX's keys take 32 bits of a seed (2**32 would draw what 0 draws), and the "
    "record order takes no negative one"
)


def check_steps(steps: int, cadence: int, span: Span, what: str = ":steps") -> None:
    """Refuse a run of more than `STEPS_MAX` steps, or of more than `BLOCKS_MAX`
    cadence blocks (each an engine epoch, planned before the first step).

    Raises:
        RunfileError: E-EVAL-007 naming the steps (`what`: `:steps`, `--steps`),
            the cadence and the bound.
    """
    in_range(steps, f"`{what}`", 1, STEPS_MAX, span.at("steps"))
    blocks = -(-steps // min(cadence, steps))
    if blocks > BLOCKS_MAX:
        raise fail(
            "E-EVAL-007",
            f"`{what}` {steps} in blocks of `:cadence` {cadence} makes {blocks} "
            f"cadence blocks, over the bound of {BLOCKS_MAX}: each block is an "
            "engine epoch, planned before the first step",
            span.at("cadence"),
            f"use :cadence {-(-steps // BLOCKS_MAX)} or more",
        )


eval_pass = Builtin(
    "defeval",
    _eval_pass,
    (0, 0),
    ("loader", "every", "batches"),
    ("loader",),
    "(defeval name :loader (loader ...) :every N)",
)
defrun = Builtin(
    "defrun",
    _defrun,
    (0, 0),
    ("steps", "microbatches", "cadence", "precision", "seed"),
    ("steps",),
    "(defrun :steps N :microbatches M :precision :f32 :seed S)",
)


def names() -> dict[str, Builtin]:
    """`loader`, `files` and `field`, bound in every run file."""
    return {
        "loader": Builtin(
            "loader",
            _loader,
            (0, 0),
            ("sources", "fields", "batch-size", "infinite"),
            ("sources", "fields", "batch-size"),
            "(loader :sources [...] :fields [...] :batch-size N)",
        ),
        "files": Builtin(
            "files",
            _files,
            (1, 1),
            ("encoding",),
            doc='(files ["path" ...] :encoding "jsonl.gz")',
        ),
        "field": Builtin(
            "field",
            _field,
            (1, 2),
            ("from", "dtype", "shape"),
            doc='(field :name :from "key" :dtype :i32 :shape [n]) '
            "or (field batch :name)",
        ),
    }
