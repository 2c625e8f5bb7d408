"""`RecordHeader`: the typed JSON header of a checkpoint record.

Everything a record holds besides its arrays (step, epoch, seed, preset, config,
metrics, stop_reason, run ids, logger state, early-stop and Plateau counters, anchor
checksums, format and framework versions) is one `RecordHeader`, stored as a JSON
object under the `jaxnitro` key of the `.safetensors` metadata. Writers build one;
readers read its attributes, so a misspelled key is an AttributeError at the line
that misspells it, never a silent None.

`from_json` refuses a header it cannot vouch for, naming the key, the file and the
fix: an unknown key (edited, or written by a newer jaxnitro or another program), a
missing key every record of its format holds, or a value of the wrong JSON type.
Keys added to format 1 after its first release (`OPTIONAL_KEYS`) may be absent from
a record an earlier build wrote; they read as the field's documented default, which
reproduces that build's behaviour.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import CheckpointError
from ..watch import did_you_mean

FORMAT_VERSION = 1
"""The record format this jaxnitro writes and reads."""

JsonObject = dict[str, Any]
"""A JSON object as `json.loads` returns it (the header never mutates one)."""


@dataclass(frozen=True, kw_only=True)
class RecordHeader:
    """A checkpoint record's header: one typed field per JSON key.

    The JSON form of each field is what the file holds under the key of the same
    name; the fields are declared in the order the keys are written.

    Attributes:
        framework_version: the jaxnitro version that wrote the record (string).
        experiment: the experiment class, `"<module>.<qualname>"` (string).
        epoch: the epoch the record was written after (integer).
        step: the optimizer steps taken by then (integer).
        seed: the run's global seed, which a resume adopts (integer).
        preset: the preset the experiment was built from (string, or null).
        graphconst: the GraphConst fields by name, as `graphconst_record` writes
            them (object); a resume refuses a record whose values differ.
        config: the logged run parameters, `params_to_log` (object); a weights load
            reads derived Host scalars from it.
        derived: the fields derive produced (list of strings). Default None
            (absent): a record from before the list was kept, for which a weights
            load runs derive and lets the record's Device values override it.
        derived_host: derived Host values kept as JSON values (object). Default
            `{}` (absent): none were kept.
        derived_graphconst: derived GraphConst values JSON reads back exactly,
            tuples as lists (object). Default None (absent): read them from
            `graphconst`, as records before it did.
        logger_type: the logger's class, `"<module>.<qualname>"` (string, or null
            for no logger); a resume refuses a logger of another type.
        logger_state: what the logger needs to continue its logged run on resume
            (any JSON value; null: nothing). Default None (absent): a record
            `average_checkpoints` wrote, which reattaches no logger.
        run_id: the logger's run id, informational (usually a string, or null).
        run_url: the logger's URL for the run (usually a string, or null).
        anchor_checksums: each decay-anchored group's anchor checksum by group name
            (object of strings). Default None (absent): a record from before anchors
            were checksummed, with nothing a resume can verify.
        optimizer_layout: the optimizer state's layout, `state_layout()` (object).
            Default None (absent): the state is restored leaf for leaf, unchecked.
        early_stop: the early-stopping policy's counters, its `state()` (any JSON
            value; null: no policy). Default None (absent): nothing to continue.
        plateau: each Plateau's counters by schedule key (object). Default `{}`
            (absent): every Plateau starts afresh.
        epoch_loss: the running train loss of an epoch a stop cut, so a resume that
            continues the epoch reports the whole epoch's mean (object; null when
            the epoch ended). Default None (absent).
        averaged_from: what an average averaged: spec, run, dir, files, epochs,
            weights and state_from (object). Default None, and the key is left out
            of the JSON then: a record of a run that did not start from an average.
        hook_fingerprints: the code fingerprint of each hook the run trained with,
            by hook name (object of strings), as the stale-handle check computes
            them; a resume warns naming the hooks whose code changed. Default None
            (absent, and left out of the JSON then): a record from before they
            were kept, or an average.
        data_signature: the shape of the data the run trained on: the train and
            val split sizes in batches (`splits`), the train batch size
            (`batch_size`) and each train field's per-sample shape and dtype
            (`fields`) (object). A resume refuses a change unless told it is
            meant. Default None (absent, and left out of the JSON then): a record
            from before it was kept, or an average.
        run: the checkpoint run id the manifest lists the record under (string, or
            null for a run with no id and for an average).
        metrics: the epoch's scalar validation metrics (object; `{}` with no val
            split and for an average).
        stop_reason: how the run ended, when this is its last record (one of
            "completed", "early_stop", "requested", "preempted", "error"; else null).
        prng_keys: the key implementation of each stored PRNG key array, by array
            name (object of strings).
        format_version: the record format, `FORMAT_VERSION` (integer).

    Examples:
        >>> header = RecordHeader(
        ...     framework_version="0.1.0", experiment="exp.MyExp", epoch=2, step=8,
        ...     seed=42, preset=None, graphconst={"width": 8}, config={},
        ...     logger_type=None, run_id=None, run_url=None)
        >>> header.to_json()["seed"]
        42
        >>> RecordHeader.from_json(header.to_json(), path="x.safetensors") == header
        True
    """

    framework_version: str
    experiment: str
    epoch: int
    step: int
    seed: int
    preset: str | None
    graphconst: JsonObject
    config: JsonObject
    derived: tuple[str, ...] | None = None
    derived_host: JsonObject = field(default_factory=dict)
    derived_graphconst: JsonObject | None = None
    logger_type: str | None
    logger_state: Any = None
    run_id: Any
    run_url: Any
    anchor_checksums: dict[str, str] | None = None
    optimizer_layout: JsonObject | None = None
    early_stop: Any = None
    plateau: JsonObject = field(default_factory=dict)
    epoch_loss: JsonObject | None = None
    averaged_from: JsonObject | None = None
    hook_fingerprints: dict[str, str] | None = None
    data_signature: JsonObject | None = None
    # Filled in by `Checkpointer.save` (run, metrics, stop_reason) and by
    # `save_record` (prng_keys): defaults for the writer, required in a file.
    run: str | None = None
    metrics: JsonObject = field(default_factory=dict)
    stop_reason: str | None = None
    prng_keys: dict[str, str] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        # A writer's mistake is refused here, before a file is written.
        _check_types(vars(self), where="RecordHeader", fix="")

    def to_json(self) -> JsonObject:
        """The header as the JSON object a record file stores: a new dict, whose
        values are the header's own (never mutate them)."""
        obj: JsonObject = {}
        for name in KEYS:
            value = getattr(self, name)
            if name in _LEFT_OUT_WHEN_NONE and value is None:
                continue
            obj[name] = list(value) if isinstance(value, tuple) else value
        return obj

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], *, path: str) -> RecordHeader:
        """The header a record file at `path` stores as `obj`.

        Raises `CheckpointError` naming the key, the file and the fix for another
        format version, an unknown key, a missing required key or a value of the
        wrong type. An absent key of `OPTIONAL_KEYS` reads as its default.
        """
        version = obj.get("format_version")
        if type(version) is not int or version != FORMAT_VERSION:
            raise CheckpointError(
                f"{path} has record format {version!r}; this jaxnitro reads format "
                f"{FORMAT_VERSION}."
            )
        unknown = sorted(set(obj) - set(KEYS) - _RETIRED_KEYS)
        if unknown:
            raise CheckpointError(
                UNKNOWN_KEY.format(
                    path=path,
                    key=unknown[0],
                    others=_others(unknown),
                    version=FORMAT_VERSION,
                    hint=did_you_mean(unknown[0], KEYS),
                )
            )
        missing = [key for key in KEYS if key not in obj and key not in OPTIONAL_KEYS]
        if missing:
            raise CheckpointError(
                MISSING_KEY.format(
                    path=path,
                    key=missing[0],
                    others=_others(missing),
                    version=FORMAT_VERSION,
                )
            )
        values = {key: obj[key] for key in KEYS if key in obj}
        _check_types(values, where=path, fix=_DAMAGED, sequence=list)
        if values.get("derived") is not None:
            values["derived"] = tuple(values["derived"])
        return cls(**values)


KEYS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(RecordHeader))
"""Every key of a format-1 header, in the order they are written."""

OPTIONAL_KEYS = frozenset(
    {
        "derived",
        "derived_host",
        "derived_graphconst",
        "logger_state",
        "anchor_checksums",
        "optimizer_layout",
        "early_stop",
        "plateau",
        "epoch_loss",
        "averaged_from",
        "hook_fingerprints",
        "data_signature",
    }
)
"""Keys a format-1 record may lack: added after the format's first release, or left
out by the writer (`averaged_from` of an ordinary run, `logger_state` of an average).
Each reads as its field's default. Every other key is required."""

# Left out of the JSON when None, so a record without them reads in a build from
# before the key was added.
_LEFT_OUT_WHEN_NONE = frozenset(
    {"averaged_from", "hook_fingerprints", "data_signature"}
)

# Written by builds before `optimizer_layout` replaced it (the optimizer's repr); it
# carried nothing a reader used, so such a record reads without it.
_RETIRED_KEYS = frozenset({"optimizer"})

UNKNOWN_KEY = """\
{path}: its record header holds the key `{key}`{others}, which a format-{version} \
record does not have.{hint} The header was edited, or the file was written by a newer \
jaxnitro or by another program: read it with the jaxnitro that wrote it, or use \
another checkpoint. A header key this version does not know is never ignored."""

MISSING_KEY = """\
{path}: its record header lacks the key `{key}`{others}, which every format-{version} \
record holds. The header was edited or the file was not written by jaxnitro: use \
another checkpoint, or restore this one from a copy."""

WRONG_TYPE = """\
{where}: the record header's `{key}` is {value!r}, a {kind}; it must be {form}.{fix}"""

_DAMAGED = " The header was edited or damaged: use another checkpoint."


def _others(keys: list[str]) -> str:
    rest = keys[1:]
    return f" (and {', '.join(f'`{k}`' for k in rest)})" if rest else ""


# What a tuple field holds: a tuple in a RecordHeader, a list in its JSON.
_SequenceType = type[tuple[Any, ...]] | type[list[Any]]


@functools.cache
def _hints() -> dict[str, Any]:
    return typing.get_type_hints(RecordHeader)


def _check_types(
    values: Mapping[str, Any],
    *,
    where: str,
    fix: str,
    sequence: _SequenceType = tuple,
) -> None:
    """Refuse a value whose type is not its field's, naming the key. `sequence`:
    what a tuple field holds (a list in JSON)."""
    hints = _hints()
    for key, value in values.items():
        if not _conforms(value, hints[key], sequence):
            raise CheckpointError(
                WRONG_TYPE.format(
                    where=where,
                    key=key,
                    value=value,
                    kind=type(value).__name__,
                    form=_form(hints[key]),
                    fix=fix,
                )
            )


def _conforms(value: Any, hint: Any, sequence: _SequenceType) -> bool:
    if hint is Any:
        return True
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, arg, sequence) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is int:  # a JSON true is not a count
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin is dict:
        key_hint, value_hint = typing.get_args(hint)
        return isinstance(value, dict) and all(
            _conforms(k, key_hint, sequence) and _conforms(v, value_hint, sequence)
            for k, v in value.items()
        )
    if origin is tuple:
        (item_hint, _) = typing.get_args(hint)  # tuple[X, ...]
        return isinstance(value, sequence) and all(
            _conforms(v, item_hint, sequence) for v in value
        )
    raise TypeError(f"RecordHeader has a field of unchecked type {hint!r}")


def _form(hint: Any, *, plural: bool = False) -> str:
    """`hint` as the JSON form a reader of a message understands."""
    if hint is Any:
        return "JSON values" if plural else "any JSON value"
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_form(arg, plural=plural) for arg in typing.get_args(hint))
    if hint is type(None):
        return "nulls" if plural else "null"
    if origin is dict:
        values = typing.get_args(hint)[1]
        of = "" if values is Any else f" of {_form(values, plural=True)}"
        return ("objects" if plural else "an object") + of
    if origin is tuple:
        of = f" of {_form(typing.get_args(hint)[0], plural=True)}"
        return ("lists" if plural else "a list") + of
    names = {int: ("an integer", "integers"), str: ("a string", "strings")}[hint]
    return names[plural]
