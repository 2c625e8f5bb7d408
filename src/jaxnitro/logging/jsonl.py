"""`JSONLogger`: the default logger, one JSON object per line.

    {"type": "params", "run_id": "3f2a9c1d", "seed": 42, "max_epochs": 40}
    {"type": "other", "run_id": "3f2a9c1d", "key": "binding_report", "value": "..."}
    {"type": "metrics", "run_id": "3f2a9c1d", "context": "train", "epoch": 1,
     "step": 50, "loss": 0.31}
    {"type": "metrics", "run_id": "3f2a9c1d", "context": "train_epoch", "epoch": 1,
     "step": 160, "loss": 0.34}
    {"type": "metrics", "run_id": "3f2a9c1d", "context": "validate", "epoch": 1,
     "step": 160, "loss": 0.29}
    {"type": "resume", "run_id": "3f2a9c1d", "step": 160, "epoch": 1,
     "source": "runs/Exp/checkpoints/epoch-0001-step-160.safetensors"}
    {"type": "epoch", "run_id": "3f2a9c1d", "row": {"epoch": 1, "step": 160,
     "train_loss": 0.31, "loss": 0.29, "seconds": 4.2}}
    {"type": "finish", "run_id": "3f2a9c1d", "status": "completed"}

Inside a run every line carries the run's id (`run_id`; a logger used on its own,
never bound to a run, leaves the key out). The keys a line keeps for itself (`type`,
`run_id`; on a metrics line also `context`, `epoch`, `step`) are never a metric's or a
parameter's name: a clash is refused, naming the key, rather than one value silently
replacing the other.

Metrics lines by context: "train", a step's line, every `log_every_n_steps`-th
optimizer step (its loss, loss terms, train_metrics and schedule values);
"train_epoch", the train summary every epoch ends with whatever that cadence, at the
epoch's last step (the epoch's mean loss, the history's `train_loss`, and each
train_metrics value averaged over the epoch's steps, the mean of what their train
lines carry; a stop or max_steps that cuts an epoch writes one for the part, and the
continued epoch's loss covers the whole epoch, its train_metrics the steps after
the resume); "validate", the validation metrics; "data", the epoch's
`data_wait_frac`.

Cost and crash safety. Train lines (metrics lines of context "train") are held in
memory, their device values unread (`log_deferred_metrics`), and written together,
read back in one transfer, by the first line logged `flush_secs` seconds (5 by
default) or more after the last write: the lines held at any moment were logged
within less than `flush_secs` of each other (the first deferred one is written at
once, so a metric named like a line key is refused at the first logged step). An
epoch's summary ("train_epoch") and data lines wait for its epoch line: one write for
the three, where nothing runs between them but the run's own bookkeeping (a run
flushes its logger before a validation and before its on_epoch_end hooks). Every
other line (params, validate, epoch, resume, finish...) is written and flushed at
once, with whatever was held before it, and so is everything held at `flush()`,
`finish()` and `close()`. A run writes its data and epoch lines at the end of every
epoch and finishes its logger on every exit, a raising one included, so a process
killed outright (SIGKILL; the file is flushed to the operating system, not fsynced)
loses only the train lines it held, less than `flush_secs` seconds of them, all from
the epoch it was in (and its summary and data lines, if killed in the moment between
them and the epoch line).

The file is opened in append mode, so a resumed run extends the same file. A crash
can leave its last line partial; the next open repairs it: a fragment that is not a
whole JSON object is moved to `<path>.partial` and cut from the log, with a warning
and an "other" line `log_repaired` that says how many bytes went where. A resumed run
then writes a `resume` line with the step and epoch it continues from: the train
lines before it with a larger step are the ones the crash cut short, trained again
after it. With pandas:

    df = pd.read_json(path, lines=True)
    df["segment"] = (df["type"] == "resume").cumsum()   # 0 before the first resume
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from typing import Any, TextIO

from ..errors import ConfigError, NitroWarning, user_stacklevel
from .deferred import DeferredMetrics, resolve_all
from .protocol import finite_only
from .values import as_scalar, jsonable

FLUSH_SECONDS = 5.0
"""How long a train line may wait in memory before it is written: what a crash loses."""

LINE_KEYS = ("type", "run_id")
"""The keys every line keeps for itself."""

METRIC_LINE_KEYS = (*LINE_KEYS, "context", "epoch", "step")
"""The keys a metrics line keeps for itself."""

PARTIAL_SUFFIX = ".partial"
"""Where a repaired log's cut fragment goes: `<path>.partial`."""

RESERVED_METRIC = """\
A metric logged under context "{context}" is named `{key}`, a key JSONLogger's metrics \
lines keep for themselves ({keys}): one of the two values would be lost and the line \
would no longer say what it is. Rename the metric (`{key}_value`, say) where it is \
returned: train_metrics or the loss terms for a train line, metrics or \
finalize_metrics for a validate line."""

RESERVED_PARAM = """\
The logged parameter `{key}` ({value!r}) has the name of a key JSONLogger's lines \
keep for themselves ({keys}): the params line would lose one of the two. Rename \
the experiment field (`model_{key}`, say), or the parameter passed to log_params."""

REPAIRED = """\
{path} ended in a partial line of {size} bytes, left by a process that stopped \
mid-write: moved it to {aside} and continued after the last whole line."""

_Held = dict[str, Any] | tuple[dict[str, Any], DeferredMetrics]
"""A line not yet written: a whole record, or a metrics head and its deferred values."""


def _check_metric_keys(metrics: Any, context: str) -> None:
    for key in METRIC_LINE_KEYS:
        if key in metrics:
            raise ConfigError(
                RESERVED_METRIC.format(
                    context=context, key=key, keys=", ".join(METRIC_LINE_KEYS)
                )
            )


HELD_CONTEXTS = ("train", "train_epoch", "data")
"""The metrics lines held rather than written at once: train lines (up to
`flush_secs`), and an epoch's summary and data lines, written with the epoch line the
run logs after them (one write an epoch where there were three), or before the
validation or the on_epoch_end hook that comes between (the run flushes there)."""


class JSONLogger:
    """Writes JSON Lines to `path`, or to `metrics.jsonl` in the run directory.

    Args:
        path: the file; None lets setup bind it to `<run_dir>/metrics.jsonl`.
        flush_secs: how long train lines are held: they are written by the first
            line logged this many seconds or more after the last write (see the
            module docstring); 0 writes every line at once.

    Examples:
        >>> import tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "m.jsonl")
        >>> lg = JSONLogger(path)
        >>> lg.log_metrics({"loss": 0.5}, step=1, epoch=1, context="train")
        >>> lg.finish("completed")
        >>> with open(path) as f:
        ...     f.readline().strip()
        '{"type": "metrics", "context": "train", "epoch": 1, "step": 1, "loss": 0.5}'
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        flush_secs: float = FLUSH_SECONDS,
    ) -> None:
        if not isinstance(flush_secs, int | float) or not flush_secs >= 0:
            raise ConfigError(
                f"JSONLogger's flush_secs must be a number of seconds >= 0, got "
                f"{flush_secs!r}. Pass 0 to write every line at once, or the longest "
                f"a train line may wait in memory (default {FLUSH_SECONDS:g})."
            )
        self.path = os.fspath(path) if path is not None else None
        self.flush_secs = float(flush_secs)
        self.run_id: str | None = None
        self._file: TextIO | None = None
        self._held: list[_Held] = []
        self._flushed_at = time.monotonic()
        self._deferred_seen = False  # the first deferred line is written at once

    def bind_run_dir(self, run_dir: str) -> None:
        """Give a pathless logger its file in the run directory (done at setup)."""
        if self.path is None:
            self.path = os.path.join(run_dir, "metrics.jsonl")

    def bind_run_id(self, run_id: str | None) -> None:
        """The id every later line carries (done at setup, for each run)."""
        self.run_id = run_id

    # ------------------------------------------------------------ writing ---------
    def _head(self, kind: str) -> dict[str, Any]:
        head: dict[str, Any] = {"type": kind}
        if self.run_id is not None:
            head["run_id"] = self.run_id
        return head

    def _hold(self, entry: _Held, *, now: bool) -> None:
        """Keep `entry` to write; write everything held when `now` or when the
        last write was `flush_secs` or more ago."""
        if self.path is None:
            raise ConfigError(
                "JSONLogger has no path yet: pass one, or let a Nitro bind it to the "
                "run directory."
            )
        self._held.append(entry)
        if now or time.monotonic() - self._flushed_at >= self.flush_secs:
            self.flush()

    def flush(self) -> None:
        """Write every held line, their device values read back in one transfer,
        and hand the file to the operating system."""
        held, self._held = self._held, []
        self._flushed_at = time.monotonic()
        if not held:
            if self._file is not None:
                self._file.flush()
            return
        values = iter(resolve_all([e[1] for e in held if isinstance(e, tuple)]))
        texts, refused = [], None
        for entry in held:
            if isinstance(entry, tuple):
                head, _ = entry
                metrics = next(values)
                try:
                    _check_metric_keys(metrics, head["context"])
                except ConfigError as error:  # the others are still written
                    refused = refused or error
                    continue
                record = head | finite_only(metrics)
            else:
                record = entry
            texts.append(json.dumps(jsonable(record)) + "\n")
        file = self._open()
        file.write("".join(texts))
        file.flush()
        if refused is not None:
            raise refused

    def _open(self) -> TextIO:
        if self._file is None or self._file.closed:
            assert self.path is not None  # _hold refuses a pathless logger
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            repaired = repair_partial_line(self.path)
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
            if repaired is not None:
                note = self._head("other") | {"key": "log_repaired", "value": repaired}
                self._file.write(json.dumps(note) + "\n")
        return self._file

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
        """One metrics line under `context` ("train", "train_epoch", "validate",
        ...); a train line may wait up to `flush_secs`, an epoch's summary and
        data lines for its epoch line, any other is written at once."""
        _check_metric_keys(metrics, context)
        head = self._head("metrics") | {
            "context": context,
            "epoch": epoch,
            "step": step,
        }
        self._hold(head | dict(metrics), now=context not in HELD_CONTEXTS)

    def log_deferred_metrics(
        self, line: DeferredMetrics, *, step: int, epoch: int, context: str
    ) -> None:
        """A metrics line whose values are still on the device: held, unread, and
        read back with the other held lines when they are written. A subclass that
        overrides `log_metrics` gets the line there, resolved now, as before."""
        if type(self).log_metrics is not JSONLogger.log_metrics:
            values = finite_only(line.resolve())
            self.log_metrics(values, step=step, epoch=epoch, context=context)
            return
        head = self._head("metrics") | {
            "context": context,
            "epoch": epoch,
            "step": step,
        }
        # The first is written at once, so a metric named like a line key is refused
        # at the first logged step, and the file shows the run's first train line.
        first, self._deferred_seen = not self._deferred_seen, True
        self._hold((head, line), now=first or context != "train")

    def log_params(self, params: dict[str, Any]) -> None:
        """The run's hyperparameters, one line."""
        for key in LINE_KEYS:
            if key in params:
                raise ConfigError(
                    RESERVED_PARAM.format(
                        key=key, value=params[key], keys=", ".join(LINE_KEYS)
                    )
                )
        self._hold(self._head("params") | dict(params), now=True)

    def log_other(self, key: str, value: Any) -> None:
        """A free-form value, such as the binding report."""
        self._hold(self._head("other") | {"key": key, "value": value}, now=True)

    def log_tags(self, tags: Any) -> None:
        """Free-form tags."""
        self._hold(self._head("tags") | {"tags": tags}, now=True)

    def log_confusion(self, matrix: Any, labels: Any, *, epoch: int) -> None:
        """A confusion matrix and its labels."""
        line = {"epoch": epoch, "matrix": matrix, "labels": labels}
        self._hold(self._head("confusion") | line, now=True)

    def log_resume(
        self, *, step: int, epoch: int, run_id: str | None, source: str | None
    ) -> None:
        """The `resume` line: the run `run_id` continues from `step` and `epoch`, the
        position of the record `source`."""
        line = {"type": "resume", "run_id": run_id, "step": step, "epoch": epoch}
        self._hold(line | {"source": source}, now=True)

    def log_epoch(self, row: dict[str, Any]) -> None:
        """The `epoch` line: an epoch's history row (its scalar values; a
        non-finite one is null), what `nitro history` reads back."""
        kept = {}
        for key, value in row.items():
            is_scalar, scalar = as_scalar(value)
            if is_scalar and isinstance(scalar, bool | int | float):
                finite = not isinstance(scalar, float) or math.isfinite(scalar)
                kept[key] = scalar if finite else None
        self._hold(self._head("epoch") | {"row": kept}, now=True)

    def finish(self, status: str) -> None:
        """The finish line with the run's outcome; closes the file."""
        try:
            self._hold(self._head("finish") | {"status": status}, now=True)
        finally:
            self.close()

    def close(self) -> None:
        """Write what is held and close the file; the next line reopens it in
        append mode."""
        try:
            if self._held and self.path is not None:
                self.flush()
        finally:
            self._held = []
            if self._file is not None:
                self._file.close()
                self._file = None

    def __del__(self) -> None:
        # No module globals here (contextlib would do): at interpreter exit they
        # may be gone already, and so may JAX.
        try:  # noqa: SIM105 (contextlib.suppress is a module global)
            self.close()
        except Exception:
            pass

    # ------------------------------------------------------------ identity -------
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


def repair_partial_line(path: str) -> dict[str, Any] | None:
    """Cut a partial last line a crash left in the JSON-lines file `path`.

    A last line without its newline that is a whole JSON object only lacks the
    newline, which is added. Anything else after the last newline is appended to
    `<path>.partial` (first, so no byte is lost) and then cut from `path`, with a
    `NitroWarning`. Returns what was moved (`{"bytes", "moved_to"}`), else None.

    Examples:
        >>> import tempfile, os, warnings
        >>> path = os.path.join(tempfile.mkdtemp(), "m.jsonl")
        >>> with open(path, "w") as f:
        ...     _ = f.write('{"a": 1}\\n{"a": 2, "b')
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore")  # it warns: a line was cut
        ...     repair_partial_line(path)["bytes"]
        11
        >>> with open(path) as f:
        ...     f.read()
        '{"a": 1}\\n'
    """
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        return None
    if size == 0:
        return None
    with open(path, "rb+") as file:
        file.seek(size - 1)
        if file.read(1) == b"\n":
            return None
        keep = _after_last_newline(file, size)
        file.seek(keep)
        tail = file.read()
        if _is_whole_object(tail):
            file.seek(size)
            file.write(b"\n")
            return None
        aside = path + PARTIAL_SUFFIX
        with open(aside, "ab") as moved:
            moved.write(tail + b"\n")
            moved.flush()
            os.fsync(moved.fileno())
        file.truncate(keep)
    warnings.warn(
        REPAIRED.format(path=path, size=len(tail), aside=aside),
        NitroWarning,
        stacklevel=user_stacklevel(),
    )
    return {"bytes": len(tail), "moved_to": aside}


def _after_last_newline(file: Any, size: int, chunk: int = 1 << 16) -> int:
    """The offset just past the last newline of `file` (0 when there is none)."""
    end = size
    while end > 0:
        start = max(0, end - chunk)
        file.seek(start)
        found = file.read(end - start).rfind(b"\n")
        if found >= 0:
            return start + found + 1
        end = start
    return 0


def _is_whole_object(data: bytes) -> bool:
    try:
        return isinstance(json.loads(data.decode("utf-8")), dict)
    except ValueError:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return False
