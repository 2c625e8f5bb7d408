"""A run directory's whole history, read back from its `metrics.jsonl`.

A handle's `history` holds the epochs that handle trained: after a resume it starts
at the resumed epoch. The run directory's log holds every line of every run written
there (each carries its `run_id`; a resume appends to the same file), and one
`epoch` line per epoch trained, the history row the handle kept. `read_run_logs`
puts each run's rows back together across its segments (a segment is one handle's
training: it starts at the run's `params` line), in epoch order.

Duplicate epochs. The rows a log holds for one epoch of one run are reduced to one:

* A `resume` line saying the run continues from epoch k drops the rows of that run
  past epoch k written before it: they belong to the branch the resume abandoned
  (the epochs after the record it resumed from, trained again after the resume).
* Otherwise the later row of an epoch replaces the earlier one: an epoch a stop cut
  short has a row, replaced when a later `train()` finishes that epoch, as the
  handle's own history does.

A log written before `epoch` lines existed has its rows rebuilt from the `validate`
lines (epoch, step, the validation metrics; the last line of an epoch wins); such
rows lack `train_loss` and `seconds`.

The file is untrusted input: each line is parsed with `loads_bounded` (at most
`LINE_BYTES` bytes, `LINE_DEPTH` levels of nesting); a line that is over a limit,
not JSON or not an object is skipped and reported in `RunLog.skipped`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from ..errors import ConfigError
from ..json_bounds import JSONRefused, loads_bounded

LOG_NAME = "metrics.jsonl"
"""The default logger's file in a run directory."""
LINE_BYTES = 1 << 20
"""The longest line read (1 MiB); a longer one is skipped."""
LINE_DEPTH = 32
"""The deepest nesting of a line read."""

NO_RUN_DIR = (
    "{path} is not a directory. Pass the run directory a run wrote into (its "
    "run_dir, by default runs/<ExperimentClass>)."
)
NO_LOG = (
    "{path} holds no {name}: the default logger (JSONLogger) writes it there, so "
    "this run directory was written with another logger or logging off, or it is "
    "not a run directory. Pass the run directory a run wrote into."
)
NO_RUN = "{path} holds no run {run!r}; its runs: {runs}. Pass --run one of them."


@dataclass(frozen=True)
class RunLog:
    """One run's history as its log holds it, across every segment.

    Attributes:
        run_id: the run's id (None for lines written without one).
        rows: one dict per epoch, ascending, each with `epoch`, `step`, usually
            `train_loss`, the validation metrics and `seconds`, and `segment`: the
            segment (1 for the first handle, 2 after the first resume, ...) that
            trained it.
        segments: how many segments (handles) trained this run.
        resumed_from: the epoch each resume continued from, in order.
        status: the last `finish` line's status ("completed", "early_stop", ...),
            None when none was written (a run still training, or killed).
        skipped: `line N: why` for each line of the file that was skipped
            (the same for every run of one file).
    """

    run_id: str | None
    rows: tuple[dict[str, Any], ...]
    segments: int
    resumed_from: tuple[int, ...] = ()
    status: str | None = None
    skipped: tuple[str, ...] = field(default=(), repr=False)

    @property
    def epochs(self) -> tuple[int, ...]:
        """The epochs the rows hold, ascending."""
        return tuple(row["epoch"] for row in self.rows)


class _Run:
    """A run's rows while the log is read."""

    def __init__(self) -> None:
        self.rows: dict[int, dict[str, Any]] = {}
        self.validated: dict[int, dict[str, Any]] = {}
        self.segments = 0
        self.resumed_from: list[int] = []
        self.status: str | None = None

    def add(self, line: dict[str, Any]) -> None:
        kind = line.get("type")
        if kind == "params":
            self.segments += 1
        elif kind == "resume" and _is_int(line.get("epoch")):
            epoch = line["epoch"]
            self.resumed_from.append(epoch)
            for table in (self.rows, self.validated):
                for gone in [e for e in table if e > epoch]:
                    del table[gone]
        elif kind == "epoch" and isinstance(line.get("row"), dict):
            row = line["row"]
            if _is_int(row.get("epoch")) and _is_int(row.get("step")):
                self.rows[row["epoch"]] = {**row, "segment": max(self.segments, 1)}
        elif kind == "metrics" and line.get("context") == "validate":
            if _is_int(line.get("epoch")) and _is_int(line.get("step")):
                metrics = {
                    k: v
                    for k, v in line.items()
                    if k not in ("type", "run_id", "context")
                }
                metrics["segment"] = max(self.segments, 1)
                self.validated[line["epoch"]] = metrics
        elif kind == "finish" and isinstance(line.get("status"), str):
            self.status = line["status"]

    def log(self, run_id: str | None, skipped: tuple[str, ...]) -> RunLog:
        table = self.rows if self.rows else self.validated
        return RunLog(
            run_id=run_id,
            rows=tuple(table[e] for e in sorted(table)),
            segments=max(self.segments, 1),
            resumed_from=tuple(self.resumed_from),
            status=self.status,
            skipped=skipped,
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def log_path(run_dir: str | os.PathLike[str]) -> str:
    """`<run_dir>/metrics.jsonl`, checked to exist.

    Raises:
        ConfigError: `run_dir` is not a directory, or holds no `metrics.jsonl`;
            the message names the path.
    """
    path = os.fspath(run_dir)
    if not os.path.isdir(path):
        raise ConfigError(NO_RUN_DIR.format(path=path))
    log = os.path.join(path, LOG_NAME)
    if not os.path.isfile(log):
        raise ConfigError(NO_LOG.format(path=path, name=LOG_NAME))
    return log


def read_run_logs(
    run_dir: str | os.PathLike[str], *, run: str | None = None
) -> list[RunLog]:
    """Every run's whole history in `run_dir`'s `metrics.jsonl`, by first line.

    Args:
        run_dir: the run directory.
        run: only this run id (None: every run).

    Returns:
        list[RunLog]: one per run id, in the order their first lines appear.

    Raises:
        ConfigError: no run directory, no `metrics.jsonl` in it, or no run `run`.

    Examples:
        >>> import json, os, tempfile
        >>> d = tempfile.mkdtemp()
        >>> lines = [
        ...     {"type": "params", "run_id": "r1"},
        ...     {"type": "epoch", "run_id": "r1", "row": {"epoch": 1, "step": 4}},
        ...     {"type": "epoch", "run_id": "r1", "row": {"epoch": 2, "step": 8}},
        ...     {"type": "resume", "run_id": "r1", "step": 4, "epoch": 1},
        ...     {"type": "params", "run_id": "r1"},
        ...     {"type": "epoch", "run_id": "r1", "row": {"epoch": 2, "step": 8}},
        ... ]
        >>> with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        ...     f.writelines(json.dumps(x) + "\\n" for x in lines)
        >>> [(r["epoch"], r["segment"]) for r in read_run_logs(d)[0].rows]
        [(1, 1), (2, 2)]
    """
    path = log_path(run_dir)
    runs: dict[str | None, _Run] = {}
    skipped: list[str] = []
    with open(path, "rb") as f:
        for number, data in _lines(f):
            if data is None:
                skipped.append(f"line {number}: longer than {LINE_BYTES} bytes")
                continue
            if not data.strip():
                continue
            try:
                line = loads_bounded(
                    data,
                    max_bytes=LINE_BYTES,
                    max_depth=LINE_DEPTH,
                    what=f"line {number}",
                )
            except JSONRefused as error:
                skipped.append(str(error))
                continue
            if not isinstance(line, dict):
                skipped.append(f"line {number}: not a JSON object")
                continue
            run_id = line.get("run_id")
            key = run_id if isinstance(run_id, str) else None
            runs.setdefault(key, _Run()).add(line)
    logs = [r.log(key, tuple(skipped)) for key, r in runs.items()]
    if run is not None:
        logs = [log for log in logs if log.run_id == run]
        if not logs:
            held = ", ".join(str(k) for k in runs) or "none"
            raise ConfigError(NO_RUN.format(path=path, run=run, runs=held))
    return logs


def _lines(f: BinaryIO) -> Any:
    """`(line number, bytes)` for each line, None for one over `LINE_BYTES` (read
    past in bounded pieces, never held whole)."""
    number = 0
    while True:
        data = f.readline(LINE_BYTES + 1)
        if not data:
            return
        number += 1
        if len(data) > LINE_BYTES:
            while data and not data.endswith(b"\n"):
                data = f.readline(LINE_BYTES)
            yield number, None
            continue
        yield number, data
