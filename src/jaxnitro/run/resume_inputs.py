"""What a resume compares against its record: the hooks' code and the data's shape,
the GraphConst fields and the decay anchors; and what it continues of it (the seed,
the early-stopping and Plateau counters).

A record keeps the code fingerprint of each hook the run trained with (the ones the
stale-handle check computes, `experiment.hooks.hook_fingerprints`) and the data
signature: the train and val split sizes in batches, the train batch size, and each
train field's per-sample shape and dtype. A resume whose code changed goes on with a
warning naming the hooks (an edit is often a fix the run is meant to continue with);
one whose data changed shape is refused naming each change, since the schedule
horizon, the epoch boundaries and the cut-epoch bookkeeping all count batches, unless
`resume_changed_data=True` says the change is meant. A record written before these
keys were kept resumes without the comparison.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping
from typing import Any

import jax

from ..checkpoint.header import RecordHeader
from ..checkpoint.record import CheckpointRecord
from ..errors import CheckpointError, ConfigError, NitroWarning, user_stacklevel
from ..experiment.view import graphconst_record
from ..loop.prepared import Routing
from ..optim.plan import OptimizerPlan
from .config import RunConfig

log = logging.getLogger("jaxnitro")

# The splits whose size a resume compares: the ones training reads each epoch.
COMPARED_SPLITS = ("train", "val")

CODE_CHANGED = """\
Resuming {path}: the code of {hooks} changed since the record was written (its code \
fingerprint differs), and the run continues with the code as it is now. If the \
change was not meant, resume with the code that wrote the record."""

DATA_CHANGED = """\
Cannot resume from {path}: the data differs from what the record was trained on: \
{changes}. The epoch length, the schedule horizon and a cut epoch's position all \
count batches, so the run would not continue as it was. Resume with the data it \
was trained on, start a new run from its weights (weights= instead of resume=), or \
pass resume_changed_data=True if the change is meant."""

DATA_CHANGED_ALLOWED = """\
Resuming {path} with changed data (resume_changed_data=True): {changes}."""

NOT_RESUMING = """\
resume_changed_data=True lets a resume go on when its data changed, but this \
construction resumes nothing (resume={resume!r}). Drop resume_changed_data, or \
pass resume=."""


def data_signature(
    split_sizes: Mapping[str, int], routing: Routing
) -> dict[str, Any] | None:
    """The train data's shape as a record keeps it (JSON), or None without a
    train split.

    Examples:
        >>> from jaxnitro.loop.prepared import Routing
        >>> routing = Routing(fields={}, train_fields=("x",), gradient_fields=None,
        ...     train_batch=8, sample_shapes={"x": (3,)}, residency={},
        ...     sample_dtypes={"x": "float32"})
        >>> data_signature({"train": 4, "test": 2}, routing)
        {'splits': {'train': 4}, 'batch_size': 8, 'fields': {'x': {'shape': [3], \
'dtype': 'float32'}}}
    """
    if routing.train_batch is None:
        return None
    return {
        "splits": {n: split_sizes[n] for n in COMPARED_SPLITS if n in split_sizes},
        # The global batch: each process feeds its part, so a record written
        # across processes resumes in one process (or another count) that feeds
        # the same global batches.
        "batch_size": routing.train_batch * jax.process_count(),
        "fields": {
            name: {
                "shape": list(routing.sample_shapes.get(name, ())),
                "dtype": routing.sample_dtypes.get(name, "unknown"),
            }
            for name in routing.train_fields
        },
    }


def check_resume_flag(config: RunConfig) -> None:
    """Refuse `resume_changed_data=True` on a construction that names no resume."""
    if config.resume_changed_data and config.resume in (None, False):
        raise ConfigError(NOT_RESUMING.format(resume=config.resume))


def check_resumed_inputs(
    header: RecordHeader,
    path: str,
    *,
    hook_prints: Mapping[str, str],
    signature: Mapping[str, Any] | None,
    allow_changed_data: bool,
) -> None:
    """Compare a resumed record's hooks and data with this run's.

    Warns naming the hooks whose code changed; raises `CheckpointError` listing
    each data change (record, now), or warns instead with `allow_changed_data`.
    Without a train split (`signature` None) the data is not compared: nothing
    trains on it.
    """
    recorded_prints, recorded_data = header.hook_fingerprints, header.data_signature
    if recorded_prints is None and recorded_data is None:
        log.info(
            "resume: %s was written before records kept hook fingerprints and the "
            "data's shape; its code and data are not compared.",
            path,
        )
    # The data first: a refused resume needs no word about the code.
    changes = (
        data_changes(recorded_data, signature)
        if recorded_data is not None and signature is not None
        else []
    )
    if changes:
        listed = "; ".join(changes)
        if not allow_changed_data:
            raise CheckpointError(DATA_CHANGED.format(path=path, changes=listed))
        warnings.warn(
            DATA_CHANGED_ALLOWED.format(path=path, changes=listed),
            NitroWarning,
            stacklevel=user_stacklevel(),
        )
    if recorded_prints is not None:
        changed = hook_changes(recorded_prints, hook_prints)
        if changed:
            warnings.warn(
                CODE_CHANGED.format(path=path, hooks=_hooks_phrase(changed)),
                NitroWarning,
                stacklevel=user_stacklevel(),
            )


def hook_changes(recorded: Mapping[str, str], now: Mapping[str, str]) -> list[str]:
    """The hooks whose fingerprint differs, or that one side lacks, in order.

    Examples:
        >>> hook_changes({"forward": "a", "loss": "b"}, {"forward": "a", "loss": "c"})
        ['loss']
    """
    return [
        name
        for name in dict.fromkeys([*recorded, *now])
        if recorded.get(name) != now.get(name)
    ]


def data_changes(recorded: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """Each difference between two data signatures, as "what: was in the record,
    is now".

    Examples:
        >>> was = {"splits": {"train": 4}, "batch_size": 8, "fields": {}}
        >>> data_changes(was, {**was, "batch_size": 16})
        ['batch size: 8 in the record, 16 now']
    """
    changes = []
    splits_was, splits_now = _mapping(recorded, "splits"), _mapping(now, "splits")
    for name in COMPARED_SPLITS:
        was, is_ = splits_was.get(name), splits_now.get(name)
        if was != is_:
            changes.append(
                f"{name} split: {_batches(was)} in the record, {_batches(is_)} now"
            )
    if recorded.get("batch_size") != now.get("batch_size"):
        changes.append(
            f"batch size: {recorded.get('batch_size')} in the record, "
            f"{now.get('batch_size')} now"
        )
    fields_was, fields_now = _mapping(recorded, "fields"), _mapping(now, "fields")
    for name in dict.fromkeys([*fields_was, *fields_now]):
        was, is_ = fields_was.get(name), fields_now.get(name)
        if was != is_:
            changes.append(
                f"train field `{name}`: {_field(was)} in the record, {_field(is_)} now"
            )
    return changes


def _mapping(signature: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = signature.get(key)
    return value if isinstance(value, Mapping) else {}


def _batches(count: Any) -> str:
    return "absent" if count is None else f"{count} batches"


def _field(spec: Any) -> str:
    """`float32[28, 28]` (per sample), or "absent"."""
    if not isinstance(spec, Mapping):
        return "absent"
    shape = ", ".join(str(d) for d in spec.get("shape", ()))
    return f"{spec.get('dtype')}[{shape}]"


def _hooks_phrase(names: list[str]) -> str:
    quoted = [f"`{n}`" for n in names]
    if len(quoted) == 1:
        return f"hook {quoted[0]}"
    return f"hooks {', '.join(quoted[:-1])} and {quoted[-1]}"


def check_record_config(e: Any, record: CheckpointRecord, *, resuming: bool) -> None:
    """Compare the record's GraphConst fields with `e`'s (after derive, so a derived
    field compares too): a resume refuses a difference, a `weights=` load warns."""
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
    if resuming:
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


def adopt_resumed_seed(config: RunConfig, record: CheckpointRecord) -> RunConfig:
    """A resume continues the run it names: its recorded seed (warning when the
    one given differs)."""
    recorded = record.header.seed
    passed = config.seed
    if recorded != passed:
        warnings.warn(
            f"Resuming {record.path} with its recorded seed {recorded}; the "
            f"seed given here ({passed}) is ignored, since a resume continues the "
            f"run it names.",
            NitroWarning,
            stacklevel=user_stacklevel(),
        )
    return config.with_value("seed", recorded, source="record")


ANCHOR_CHANGED = (
    "Cannot resume from {path}: group {group!r} decays toward an anchor that differs "
    "from the one the record trained toward (checksum mismatch). An anchored run "
    "resumes only when its anchor is rebuilt identically: the same decay_anchor, and "
    'for an anchor of "w0" the same w0. The default w0 is what build_model returns '
    'for the recorded seed; a run trained with w0="weights" (L2-SP) or w0=<tree> '
    "resumes with that tree passed as w0=<tree>, e.g. w0=Nitro(e, weights=<its "
    "source>, logger=None, checkpointer=None).parameters."
)


def restore_counters(
    record: CheckpointRecord,
    plan: OptimizerPlan,
    stopper: Any,
    anchor_sums: Mapping[str, str],
) -> None:
    """A resume continues the early-stopping and Plateau counters, and verifies
    that every decay anchor is the one the record trained toward."""
    header = record.header
    stored = header.anchor_checksums or {}
    for group, checksum in anchor_sums.items():
        if group in stored and stored[group] != checksum:
            raise ConfigError(ANCHOR_CHANGED.format(path=record.path, group=group))
    if stopper is not None and header.early_stop:
        restore = getattr(stopper, "restore", None)
        if callable(restore):
            restore(header.early_stop)
    plateaus = header.plateau
    for schedule in plan.schedules:
        if schedule.plateau is not None and schedule.key in plateaus:
            schedule.plateau.restore(plateaus[schedule.key])
