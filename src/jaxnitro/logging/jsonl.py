"""`JSONLogger`: the default logger, one JSON object per line.

    {"type": "params", "seed": 42, "max_epochs": 40, "width": 128}
    {"type": "metrics", "context": "train", "epoch": 1, "step": 4, "loss": 0.31}
    {"type": "metrics", "context": "validate", "epoch": 1, "step": 160, "loss": 0.29}
    {"type": "other", "key": "binding_report", "value": "..."}
    {"type": "finish", "status": "completed"}

The file is opened in append mode and flushed after every line, so a resumed run
extends the same file and a crash loses at most the line being written. The keys a line
keeps for itself (`type`; on a metrics line also `context`, `epoch`, `step`) are never
a metric's or a parameter's name: a clash is refused, naming the key, rather than one
value silently replacing the other.
"""

from __future__ import annotations

import json
import os
from typing import Any, TextIO

from ..errors import ConfigError
from .values import jsonable

METRIC_LINE_KEYS = ("type", "context", "epoch", "step")
"""The keys a metrics line keeps for itself."""

RESERVED_METRIC = """\
A metric logged under context "{context}" is named `{key}`, a key JSONLogger's metrics \
lines keep for themselves ({keys}): one of the two values would be lost and the line \
would no longer say what it is. Rename the metric (`{key}_value`, say) where it is \
returned: train_metrics or the loss terms for a train line, metrics or \
finalize_metrics for a validate line."""

RESERVED_PARAM = """\
The logged parameter `{key}` ({value!r}) has the name of the key JSONLogger's lines \
keep for the line's kind (`type`): the params line would lose one of the two. Rename \
the experiment field (`model_{key}`, say), or the parameter passed to log_params."""


class JSONLogger:
    """Writes JSON Lines to `path`, or to `metrics.jsonl` in the run directory.

    Example:
        >>> import tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "m.jsonl")
        >>> lg = JSONLogger(path)
        >>> lg.log_metrics({"loss": 0.5}, step=1, epoch=1, context="train")
        >>> lg.finish("completed")
        >>> with open(path) as f:
        ...     f.readline().strip()
        '{"type": "metrics", "context": "train", "epoch": 1, "step": 1, "loss": 0.5}'
    """

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = os.fspath(path) if path is not None else None
        self._file: TextIO | None = None

    def bind_run_dir(self, run_dir: str) -> None:
        """Give a pathless logger its file in the run directory (done at setup)."""
        if self.path is None:
            self.path = os.path.join(run_dir, "metrics.jsonl")

    def _write(self, record: dict[str, Any]) -> None:
        if self.path is None:
            raise ConfigError(
                "JSONLogger has no path yet: pass one, or let a Nitro bind it to the "
                "run directory."
            )
        if self._file is None or self._file.closed:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        self._file.write(json.dumps(jsonable(record)) + "\n")
        self._file.flush()

    def log_metrics(
        self,
        metrics: dict[str, Any],
        *,
        step: int,
        epoch: int,
        context: str,
        **kwargs: Any,
    ) -> None:
        """One metrics line under `context` ("train", "validate", "data", ...)."""
        for key in METRIC_LINE_KEYS:
            if key in metrics:
                raise ConfigError(
                    RESERVED_METRIC.format(
                        context=context, key=key, keys=", ".join(METRIC_LINE_KEYS)
                    )
                )
        self._write(
            {"type": "metrics", "context": context, "epoch": epoch, "step": step}
            | dict(metrics)
        )

    def log_params(self, params: dict[str, Any]) -> None:
        """The run's hyperparameters, one line."""
        if "type" in params:
            raise ConfigError(RESERVED_PARAM.format(key="type", value=params["type"]))
        self._write({"type": "params"} | dict(params))

    def log_other(self, key: str, value: Any) -> None:
        """A free-form value, such as the binding report."""
        self._write({"type": "other", "key": key, "value": value})

    def log_tags(self, tags: Any) -> None:
        """Free-form tags."""
        self._write({"type": "tags", "tags": tags})

    def log_confusion(self, matrix: Any, labels: Any, *, epoch: int) -> None:
        """A confusion matrix and its labels."""
        self._write(
            {"type": "confusion", "epoch": epoch, "matrix": matrix, "labels": labels}
        )

    def finish(self, status: str) -> None:
        """The finish line with the run's outcome; closes the file."""
        self._write({"type": "finish", "status": status})
        self.close()

    def close(self) -> None:
        """Close the file; the next line reopens it in append mode."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def __del__(self) -> None:
        self.close()

    def logger_info(self) -> dict[str, Any]:
        """`{"path": ...}`, the file this logger writes (None before setup binds it)."""
        return {"path": self.path}

    def logger_state(self) -> Any:
        """The file path: a resumed run appends to the same file."""
        return {"path": self.path} if self.path is not None else None

    def reattach(self, state: Any) -> None:
        """Continue appending to the file a resumed record names."""
        if self.path is None and isinstance(state, dict) and state.get("path"):
            self.path = state["path"]

    def __repr__(self) -> str:
        return f"JSONLogger({self.path!r})"
