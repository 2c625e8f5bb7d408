"""Setup's last stage: the logger and checkpointer bound to this run.

The checkpointer learns the run directory, the monitor, the run's id (a resume of a
run's newest record continues that run; anything else is a new run, a resume of an
older record branching from it) and the filename hook; the logger the run directory
and id, and a resume's logger state. Once the write probe found the log writable,
`log_resume` writes what a resume continues.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from typing import Any

from ..checkpoint.checkpointer import Checkpointer
from ..checkpoint.filenames import new_run_id
from ..checkpoint.lookup import run_label
from ..checkpoint.manifest import read_manifest
from ..checkpoint.record import CheckpointRecord
from ..checkpoint.retention_checks import check_keep, setup_warnings
from ..checkpoint.sources import ResolvedSource
from ..errors import ConfigError, NitroWarning, user_stacklevel
from ..experiment.hooks import filename_hook
from ..logging import protocol as logproto
from .config import RunConfig

log = logging.getLogger("jaxnitro")

NOTHING_TO_RANK = (
    "The checkpointer keeps Best checkpoints but {name} defines its own metrics and "
    "no `monitor`, so there is nothing to rank by. Define monitor() returning e.g. "
    "('acc', 'max'), pass monitor=, or keep only the latest: "
    "checkpointer=Checkpointer(keep=Last(1))."
)


@dataclass(frozen=True)
class RunBinding:
    """The run's id, and the record a resume branches from into a new run.

    Attributes:
        run_id: the id this run's records and log lines carry.
        branch_parent: the record a resume of an older record branches from.
    """

    run_id: str | None
    branch_parent: str | None


def bind_run(
    config: RunConfig,
    experiment: Any,
    data: dict[str, Any],
    resume: ResolvedSource | None,
    record: CheckpointRecord | None,
) -> RunBinding:
    """Point the logger and checkpointer at the run (`record`: a resume's)."""
    ckpt = config.checkpointer
    binding = (
        _bind_checkpointer(ckpt, config, experiment, data, resume)
        if ckpt is not None
        else RunBinding(new_run_id(), None)
    )
    logger = config.logger
    bind = getattr(logger, "bind_run_dir", None)
    if callable(bind):
        bind(config.run_dir)
    bind_id = getattr(logger, "bind_run_id", None)
    if callable(bind_id):  # every line it writes carries the run's id
        bind_id(binding.run_id)
    if resume is not None and record is not None:
        _reattach_logger(logger, record)
    return binding


def _bind_checkpointer(
    ckpt: Checkpointer,
    config: RunConfig,
    experiment: Any,
    data: dict[str, Any],
    resume: ResolvedSource | None,
) -> RunBinding:
    monitor = config.monitor
    has_val, trains = "val" in data, "train" in data
    if ckpt.ranks and monitor is None and ckpt.metric is None and has_val:
        raise ConfigError(NOTHING_TO_RANK.format(name=type(experiment).__name__))
    check_keep(ckpt, trains=trains, has_val=has_val)
    parent = None
    if resume is not None and resume.entry is not None and resume.is_run_newest:
        # The newest record of a run continues that run (a legacy run: None).
        run_id: str | None = resume.entry.run
    else:
        run_id = new_run_id()
        parent = resume.path if resume is not None else None
    ckpt.bind(
        directory=config.run_dir,
        monitor=monitor,
        run=run_id,
        parent=parent,
        filename=filename_hook(experiment),
    )
    if trains and ckpt.dir is not None:
        # Quietly: a lost manifest, rebuilt, is written at the first save.
        entries = read_manifest(ckpt.dir, warn=False)
        for text in setup_warnings(ckpt, entries, trains=True):
            warnings.warn(text, NitroWarning, stacklevel=user_stacklevel())
    return RunBinding(run_id, parent)


def _reattach_logger(logger: Any, record: CheckpointRecord) -> None:
    """A resume's logger continues the record's logger state (same type only)."""
    state = record.header.logger_state
    if state is None or logger is None:
        return
    recorded_type = record.header.logger_type
    mine = type(logger)
    if recorded_type not in (None, f"{mine.__module__}.{mine.__qualname__}"):
        raise ConfigError(
            f"Cannot resume into a {mine.__name__}: the record was logged by a "
            f"{recorded_type}. Pass a logger of that type."
        )
    logproto.reattach(logger, state)


def log_resume(
    logger: Any,
    binding: RunBinding,
    resume: ResolvedSource | None,
    record: CheckpointRecord | None,
) -> None:
    """Write what a resume continues, once the probe found the log writable."""
    if resume is not None and binding.branch_parent is not None:
        _log_branch(logger, resume, str(binding.run_id))
    if resume is not None and record is not None:
        # Lines a crash left past this step are trained again after this line.
        logproto.log_resume(
            logger,
            step=record.header.step,
            epoch=record.header.epoch,
            run_id=binding.run_id,
            source=record.path,
        )


def _log_branch(logger: Any, resume: ResolvedSource, run_id: str) -> None:
    """Say that resuming `resume` starts a new run rather than continuing one."""
    entry = resume.entry
    if entry is None:
        what = "is not listed in the run directory's manifest"
    else:
        run = run_label(entry.run)
        what = f"is epoch {entry.epoch} of run {run}, not its newest record"
    log.info(
        "resume: %s %s, so this is a new run %s that branches from it; the "
        "original run's later epochs are kept.",
        resume.path,
        what,
        run_id,
    )
    logproto.log_other(logger, "branched_from", resume.path)
