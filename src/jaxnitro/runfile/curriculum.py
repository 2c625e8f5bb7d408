"""`curriculum (stage ctx observations) -> stage`: what a stage is, may change, and
how it is kept.

The run file's `curriculum` runs on the host after each cadence block (after the
block's evaluation passes), with the stage in effect, `ctx` and `observations`,
both keyword lists read with `(get ctx :step)`:

- `ctx`: `:step` (optimizer steps done), `:block` (the 1-based block that ended),
  `:blocks`, `:steps`, and `:knobs` (a keyword list of the knob values);
- `observations`: `:train/loss` (the objective's mean over the block) and every
  pass metric this block computed (`:valid/loss`, `:valid/objective`).

The stage starts as `nil` (`(get nil :key default)` is the default) and may be any
value. A stage that is a keyword list
changes the run from the next block on through two keys, both inputs of the
compiled programs, so a new stage compiles nothing:

- `:lr-scale x` (a positive number) multiplies every group's learning rate;
- `:loader L` (a loader) feeds the next blocks' records; it must declare the train
  loader's fields (names, dtypes, shapes) and batch size, since those shape the
  programs (E-RUN-006 names what differs).

Other keys, and stages of any other kind, are the run file's own: logged and handed
back. What shapes a graph (the model, a field's shape, the batch size) cannot
change through a stage. The stage is logged each block (`curriculum/stage`) and
written to `curriculum.json` in the run directory, keyed by the block's last step,
before the block's checkpoint, so a resumed run continues in the stage its record
was written under.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from .source import RunfileError, Span, did_you_mean, fail
from .stdlib_data import FieldSpec, FilesSpec, LoaderSpec, finite_train_loader
from .values import Builtin, Keyword, keyword_list, kind_of, show

STAGE_KEYS = ("lr-scale", "loader")
"""The keys of a keyword-list stage the engine applies."""
STAGE_FILE = "curriculum.json"


def _get(values: list[Any], kwargs: dict[str, Any], span: Span) -> Any:
    found, key = values[0], values[1]
    items = {} if found is None else keyword_list(found)  # nil: the first stage
    if items is None or not isinstance(key, Keyword):
        raise fail(
            "E-EVAL-007",
            f"(get list :key) reads a keyword list, got {kind_of(found)} and "
            f"{kind_of(key)}",
            span,
            "write (get ctx :step) or (get observations :valid/loss 0.0)",
        )
    if key.name in items:
        return items[key.name]
    if len(values) == 3:
        return values[2]
    raise fail(
        "E-EVAL-007",
        f"the list has no key :{key.name} (it has "
        + " ".join(f":{k}" for k in items)
        + ")",
        span.at(1),
        did_you_mean(key.name, items) or "give a default: (get list :key default)",
    )


def names() -> dict[str, Builtin]:
    """`get`, bound in every run file. Its arguments are all positional (keywords
    None), so `(get stage :count 0)` reads `:count` with the default 0."""
    return {
        "get": Builtin(
            "get", _get, (2, 3), None, doc="(get list :key) or (get list :key default)"
        )
    }


def keyword_items(items: dict[str, Any]) -> tuple[Any, ...]:
    """A mapping as the run file's keyword list `(list :a 1 :b 2)`."""
    flat: list[Any] = []
    for name, value in items.items():
        flat += [Keyword(name), value]
    return tuple(flat)


def stage_settings(
    stage: Any, train_loader: LoaderSpec, span: Span | None
) -> tuple[float, LoaderSpec]:
    """The learning-rate scale and train loader a stage sets.

    Raises:
        RunfileError: E-RUN-005 for an `:lr-scale` that is not a positive number,
            E-RUN-006 for a `:loader` that is not a loader or that differs from the
            train loader in what shapes the programs, E-LOAD-012 for one that says
            `:infinite false`.
    """
    items = keyword_list(stage) or {}
    scale = items.get("lr-scale", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, int | float) or scale <= 0:
        raise fail(
            "E-RUN-005",
            f"the curriculum's stage sets :lr-scale {show(scale)}; it must be a "
            "positive number",
            span,
            "return (list :lr-scale 2.0 ...) to double every learning rate",
        )
    loader = items.get("loader", train_loader)
    if not isinstance(loader, LoaderSpec):
        raise fail(
            "E-RUN-006",
            f"the curriculum's stage sets :loader to {kind_of(loader)}",
            span,
            "return a loader: (list :loader hard-loader)",
        )
    finite = finite_train_loader(loader, "the curriculum's stage loader", span)
    if finite is not None:
        raise RunfileError([finite])
    shaped = {"fields": loader.fields, "batch-size": loader.batch_size}
    wanted = {"fields": train_loader.fields, "batch-size": train_loader.batch_size}
    for what, value in shaped.items():
        if value != wanted[what]:
            raise fail(
                "E-RUN-006",
                f"the curriculum's stage loader has other {what} than train-loader "
                f"({_describe(value)} against {_describe(wanted[what])}): they shape "
                "the compiled programs, which a stage cannot change",
                span,
                "give the stage's loader train-loader's :fields and :batch-size",
            )
    return float(scale), loader


def _describe(value: Any) -> str:
    if isinstance(value, tuple):
        return " ".join(f":{f.name} {f.dtype}{list(f.shape)}" for f in value)
    return str(value)


def encode(value: Any) -> Any:
    """A stage as JSON: numbers, strings, booleans and nil as they are; keywords,
    lists and loaders tagged."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Keyword):
        return {"keyword": value.name}
    if isinstance(value, tuple):
        return {"list": [encode(v) for v in value]}
    if isinstance(value, LoaderSpec):
        found = dataclasses.asdict(dataclasses.replace(value, infinite_at=None))
        del found["infinite_at"]
        return {"loader": found}
    raise fail(
        "E-RUN-005",
        f"the curriculum returned {kind_of(value)}, which a stage cannot hold",
        None,
        "return numbers, strings, keywords, lists or loaders",
    )


def decode(value: Any) -> Any:
    """The stage `encode` wrote."""
    if not isinstance(value, dict):
        return value
    if "keyword" in value:
        return Keyword(value["keyword"])
    if "list" in value:
        return tuple(decode(v) for v in value["list"])
    spec = value["loader"]
    return LoaderSpec(
        tuple(FilesSpec(tuple(s["paths"]), s["encoding"]) for s in spec["sources"]),
        tuple(
            FieldSpec(f["name"], f["source"], f["dtype"], tuple(f["shape"]))
            for f in spec["fields"]
        ),
        spec["batch_size"],
        spec["infinite"],
    )


class StageFile:
    """`curriculum.json` in a run directory: the stage after each block's last step.

    Rewritten whole (a temporary file, then a rename) at each block, so it is never
    half-written.
    """

    def __init__(self, run_dir: str) -> None:
        self.path = os.path.join(run_dir, STAGE_FILE)

    def read(self) -> dict[int, Any]:
        """Step -> the stage in effect after it (encoded); {} without a file."""
        if not os.path.isfile(self.path):
            return {}
        with open(self.path, encoding="utf-8") as handle:
            found = json.load(handle)
        return {int(step): stage for step, stage in found["stages"].items()}

    def stage_at(self, step: int) -> Any:
        """The stage a run resumed at `step` continues in: the one recorded at the
        latest block end at or before it (nil before the first)."""
        stages = self.read()
        ended = [s for s in stages if s <= step]
        return decode(stages[max(ended)]) if ended else None

    def write(self, step: int, stage: Any) -> None:
        """Record `stage` as the one in effect after `step` (later steps dropped:
        they belong to a run this one replaces)."""
        stages = {s: v for s, v in self.read().items() if s < step}
        stages[step] = encode(stage)
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        temporary = self.path + ".tmp"
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump({"format": 1, "stages": stages}, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self.path)
