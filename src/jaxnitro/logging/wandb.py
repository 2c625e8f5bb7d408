"""`WandbLogger`: a Weights & Biases run, written through the `wandb.Run` it starts.

Needs the `wandb` extra (`pip install 'jaxnitro[wandb]'`); wandb is imported when the
logger starts its run, at the first verb that writes. The run is started with
`reinit="create_new"` and never made `wandb.run`, so the logger leaves the process's
global W&B state alone and two loggers can write two runs side by side. `mode` is
W&B's: "online", "offline" (the run is written under `<dir>/wandb/offline-run-*`, for
`wandb sync` later) or "disabled"; None follows `WANDB_MODE`.

What each verb writes, with the optimizer step as W&B's step:

    log_metrics   `run.log({"<context>/<name>": value}, step=step)`: numbers as they
                  are ("train/loss", "train/lr", a schedule's value in a train line,
                  "train_epoch/loss", the epoch's mean, "validate/acc",
                  "data/data_wait_frac"); another value as its JSON text
    log_params    the run's config, flattened with "/"; a value that differs from
                  the one a resumed run logged first becomes "resumed_param/<name>"
    log_other     the summary value "<key>" ("binding_report", the text table)
    log_tags      run tags: each name of a list, or "<name>:<value>" for a mapping
    log_confusion a table "confusion" (true label by predicted label) at the last
                  step logged
    finish        the summary value "stop_reason", then `run.finish(exit_code=...)`:
                  0 (completed, early_stop, requested), 0 after `mark_preempting`
                  (preempted), 1 (error, which W&B shows as failed)

Steps: W&B keeps one history row a step and ignores (with a console warning) a line
whose step is below the run's current one. The framework logs steps in order, and a
resumed run logs from the step after its checkpoint, so its lines land. A resumed
online run starts at the step after the last one W&B holds; the lines of steps a
crashed process logged past its checkpoint, trained again (bit for bit the same
values), are those W&B already has: the logger skips them itself (no warning) and
counts them in `logger_info()["skipped_lines"]`. One caveat follows: a step whose
row the crashed process had begun (its train line, say) but not finished (the
validation at that step) keeps only what it had. An offline process writes its own
offline-run directory, under the same run id; `wandb sync` uploads them to one run.

A resumed run continues the same W&B run: the W&B run id is the run's id (the one
its checkpoints carry, given by setup through `bind_run_id`), started with
`resume="allow"`; `logger_state` is `{"run_id", "project", "entity"}` and
`reattach` points the logger back at that run. A resume that branches into a new run
(a record that is not its run's newest) gets a new run id, so a new W&B run.

Only rank 0 logs a run across processes: setup gives the other ranks no logger.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..extras import require
from .values import as_scalar, flatten, jsonable

MODES = ("online", "offline", "disabled")
BAD_MODE = (
    "WandbLogger got mode={value!r}; mode must be one of 'online', 'offline' or "
    "'disabled' (or None to follow WANDB_MODE)."
)
BAD_STATE = (
    "WandbLogger.reattach needs the state logger_state() returned, a dict with "
    "'run_id' and 'project' (and 'entity'); got {value!r}. Resume with the logger "
    "type that wrote the checkpoint, or start a new logged run with weights= instead "
    "of resume=."
)
OTHER_PROJECT = (
    "WandbLogger was given {field}={mine!r}, but the run being resumed, {run_id}, "
    "was logged to {field}={theirs!r}. Pass {field}={theirs!r} (or None) to "
    "continue that run, or start a new logged run with weights= instead of resume=."
)
EXIT_CODE = {
    "completed": 0,
    "early_stop": 0,
    "requested": 0,
    "preempted": 0,
    "error": 1,
}
"""The exit code each stop reason finishes a W&B run with (non-zero: failed)."""
_BAD_PROJECT_CHARS = re.compile(r"[/\\#?%:]")


class WandbLogger:
    """Logs one Weights & Biases run.

    Args:
        project: the W&B project; None lets setup name it after the run directory
            (`runs/MyExp` gives `MyExp`) unless `WANDB_PROJECT` is set, else W&B
            chooses.
        entity: the W&B user or team; None: W&B's default.
        mode: "online", "offline" or "disabled"; None follows `WANDB_MODE`.
        dir: where W&B writes its `wandb/` folder; None lets setup use the run
            directory, else W&B's default (`WANDB_DIR`, or the working directory).
        name: the run's display name; None lets W&B choose one.
        tags: tags set when the run starts.
        group: W&B's run group.
        notes: W&B's run notes.
        settings: a `wandb.Settings`, passed to `wandb.init` as is.

    The run starts at the first verb that writes, so setup binds the run id (and a
    resume its recorded run) before it does.

    Examples:
        >>> lg = WandbLogger(project="digits", mode="offline")
        >>> lg.logger_info()["project"], lg.logger_state()
        ('digits', None)
    """

    def __init__(
        self,
        project: str | None = None,
        *,
        entity: str | None = None,
        mode: str | None = None,
        dir: str | os.PathLike[str] | None = None,
        name: str | None = None,
        tags: Sequence[str] | None = None,
        group: str | None = None,
        notes: str | None = None,
        settings: Any = None,
    ) -> None:
        if mode is not None and mode not in MODES:
            raise ConfigError(BAD_MODE.format(value=mode))
        if isinstance(tags, str):
            tags = [tags]
        self.project = project
        self.entity = entity
        self.mode = mode
        self.dir = os.fspath(dir) if dir is not None else None
        self.name = name
        self.tags = [str(t) for t in tags or ()]
        self.group = group
        self.notes = notes
        self.settings = settings
        self._explicit = {"project": project, "entity": entity}
        self._id: str | None = None
        self._run: Any = None
        self._started = False  # a run was started: logger_state has one to name
        self._floor = 0  # lines below this step W&B would ignore
        self._last_step: int | None = None
        self._skipped = 0

    def bind_run_dir(self, run_dir: str) -> None:
        """Name an unnamed project after the run directory, and write W&B's files
        there (done at setup)."""
        if self.project is None and not os.environ.get("WANDB_PROJECT"):
            name = run_dir.rstrip("/\\").replace("\\", "/").rsplit("/", 1)[-1]
            self.project = _BAD_PROJECT_CHARS.sub("_", name) or None
        if self.dir is None:
            self.dir = run_dir

    def bind_run_id(self, run_id: str | None) -> None:
        """Take the run's id as the W&B run id (done at setup, before a resume's
        `reattach`)."""
        if self._run is None and run_id is not None:
            self._id = run_id

    def backend(self) -> Any:
        """The `wandb.Run`, for images, histograms, artifacts... (started if needed)."""
        if self._run is None:
            wandb = require("wandb", extra="wandb", feature="WandbLogger")
            if self.dir is not None:
                os.makedirs(self.dir, exist_ok=True)
            run = wandb.init(
                project=self.project,
                entity=self.entity,
                mode=self.mode,
                dir=self.dir,
                id=self._id,
                name=self.name,
                tags=self.tags or None,
                group=self.group,
                notes=self.notes,
                settings=self.settings,
                resume="allow",
                reinit="create_new",
            )
            self._run = run
            self._started = True
            self._id = run.id
            self.project = run.project or self.project
            self.entity = run.entity or self.entity
            self.name = run.name or self.name
            self._floor = max(self._floor, int(run.starting_step or 0))
        return self._run

    def _log(self, data: dict[str, Any], step: int) -> bool:
        """`run.log(data, step=step)`, unless W&B would ignore the step."""
        run = self.backend()
        if step < self._floor:
            self._skipped += 1
            return False
        run.log(data, step=step)
        self._floor = step
        self._last_step = step
        return True

    # ------------------------------------------------------------ the verbs ------
    def log_metrics(
        self,
        metrics: dict[str, Any],
        *,
        step: int,
        epoch: int,
        context: str,
        **kwargs: Any,
    ) -> None:
        """Numbers as "<context>/<name>" at `step`; other values as their JSON text."""
        data: dict[str, Any] = {}
        for name, value in metrics.items():
            ok, plain = as_scalar(value)
            if ok and plain is not None:
                data[f"{context}/{name}"] = plain
            elif isinstance(value, str):
                data[f"{context}/{name}"] = value
            else:
                data[f"{context}/{name}"] = json.dumps(jsonable(value))
        if data:
            self._log(data, int(step))

    def log_params(self, params: dict[str, Any]) -> None:
        """The config, flattened with "/"; a changed value on a resumed run becomes
        "resumed_param/<name>"."""
        config = self.backend().config
        logged = dict(config)
        update: dict[str, Any] = {}
        for name, value in flatten(params).items():
            ok, plain = as_scalar(value)
            plain = plain if ok else jsonable(value)
            if name not in logged:
                update[name] = plain
            elif logged[name] != plain:
                update[f"resumed_param/{name}"] = plain
        if update:
            config.update(update, allow_val_change=True)

    def log_other(self, key: str, value: Any) -> None:
        """The summary value `key`: text as is, anything else as JSON-ready data."""
        summary = self.backend().summary
        summary[key] = value if isinstance(value, str) else jsonable(value)

    def log_tags(self, tags: Any) -> None:
        """Run tags: each name of a list, or "<name>:<value>" for a mapping."""
        if isinstance(tags, Mapping):
            names = [f"{k}:{v}" for k, v in tags.items()]
        else:
            names = [str(t) for t in ([tags] if isinstance(tags, str) else tags)]
        run = self.backend()
        have = tuple(run.tags or ())
        run.tags = have + tuple(n for n in names if n not in have)

    def log_confusion(self, matrix: Any, labels: Any, *, epoch: int) -> None:
        """A table "confusion" (a row a true label, a column a predicted one, with
        the epoch), at the last step logged."""
        wandb = require("wandb", extra="wandb", feature="WandbLogger")
        names = [str(n) for n in labels]
        rows = [
            [epoch, names[i], *row] for i, row in enumerate(np.asarray(matrix).tolist())
        ]
        table = wandb.Table(columns=["epoch", "true", *names], data=rows)
        self._log({"confusion": table}, self._floor)

    def finish(self, status: str) -> None:
        """Record the stop reason and finish the run (see EXIT_CODE)."""
        run = self.backend()
        run.summary["stop_reason"] = status
        if status == "preempted":
            run.mark_preempting()
        run.finish(exit_code=EXIT_CODE.get(status, 0))
        self._run = None

    # ------------------------------------------------------------ identity -------
    def run_id(self) -> str | None:
        """The W&B run id: the run's id once setup binds it (or W&B's own)."""
        return self._id

    def run_url(self) -> str | None:
        """The run's page; None offline, disabled, or before the run starts."""
        return getattr(self._run, "url", None) if self._run is not None else None

    def logger_info(self) -> dict[str, Any]:
        """The project, the run, where its files are, and lines skipped on resume."""
        run_dir = getattr(self._run, "dir", None) if self._run is not None else None
        return {
            "project": self.project,
            "entity": self.entity,
            "run_id": self._id,
            "run_name": self.name,
            "mode": self.mode,
            "dir": self.dir,
            "files": os.path.dirname(run_dir) if run_dir else None,
            "url": self.run_url(),
            "skipped_lines": self._skipped,
        }

    def logger_state(self) -> dict[str, Any] | None:
        """`{"run_id", "project", "entity"}`, or None before the run starts."""
        if not self._started or self._id is None:
            return None
        return {"run_id": self._id, "project": self.project, "entity": self.entity}

    def reattach(self, state: Any) -> None:
        """Continue the W&B run `state` names (a branch's new run id starts a new
        one in the same project)."""
        if (
            not isinstance(state, Mapping)
            or not isinstance(state.get("run_id"), str)
            or not isinstance(state.get("project"), str | None)
        ):
            raise ConfigError(BAD_STATE.format(value=state))
        for field in ("project", "entity"):
            mine, theirs = self._explicit[field], state.get(field)
            if mine is not None and theirs is not None and mine != theirs:
                raise ConfigError(
                    OTHER_PROJECT.format(
                        field=field, mine=mine, theirs=theirs, run_id=state["run_id"]
                    )
                )
        if self._run is not None:
            self._run.finish()
            self._run = None
        self.project = state.get("project") or self.project
        self.entity = state.get("entity") or self.entity
        if self._id is None:
            self._id = state["run_id"]

    def __repr__(self) -> str:
        return f"WandbLogger(project={self.project!r}, run_id={self._id!r})"
