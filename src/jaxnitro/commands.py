"""The Python-experiment subcommands of `nitro`: train, history, summary.

    nitro train path.py:Class [--set FIELD=VALUE ...] [--preset P] [--resume auto]
                [--run-dir DIR]
    nitro history RUN_DIR [--run ID] [--csv | --json | --plot FILE]
    nitro summary path.py:Class [--set FIELD=VALUE ...] [--preset P]

An experiment is named as the agent tools name it, `path/to/file.py:ClassName`, and
loaded the same way (`agent/loader.py`). A `--set` value is parsed by the field's
declared type inside its marker (`parse_override_text`) and then checked like an
agent override (`build_experiment`: type, range, the experiment's own rules). A name
that is no field of the class but a run keyword an agent may pass (`max_epochs`,
`seed`, ...) goes to `Nitro` as that keyword. Exit status: 0 on success, 2 for a
usage error (a malformed or refused `--set`, a file or class that cannot be loaded),
1 when training fails or the run directory cannot be read.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from .errors import ConfigError, NitroError

TRAIN_HELP = "train a Python experiment, path/to/file.py:ClassName"
HISTORY_HELP = "a run directory's whole history, across resumes, from metrics.jsonl"
SUMMARY_HELP = "a Python experiment's parameters per group, bytes, step FLOPs, programs"
SET_HELP = (
    "set a field, parsed by its declared type (int, float, bool, str; `none` for "
    "a field that takes None); a run keyword such as max_epochs or seed when the "
    "class has no such field. Repeatable."
)
NOT_A_FIELD_NOTE = " --set also takes the run keywords: {keywords}."


def add_commands(commands: Any) -> None:
    """Add `train`, `history` and `summary` to an argparse subparsers object."""
    train = commands.add_parser(
        "train",
        help=TRAIN_HELP,
        description=(
            "Train the Experiment subclass ClassName of path/to/file.py, as "
            "Nitro(ClassName(**fields), **keywords).train(), and print its history. "
            "Checkpoints and metrics.jsonl go to --run-dir (default "
            "runs/ClassName)."
        ),
    )
    _experiment_arguments(train)
    train.add_argument(
        "--resume",
        choices=("auto",),
        help="auto: continue the latest run in the run dir (a new run when it "
        "holds none), as resume='auto'",
    )
    train.add_argument("--run-dir", metavar="DIR", help="where checkpoints and logs go")
    history = commands.add_parser(
        "history",
        help=HISTORY_HELP,
        description=(
            "Every epoch of every run in RUN_DIR's metrics.jsonl, across resumes "
            "(a handle's own history starts at the epoch it resumed from). A resume "
            "from epoch k drops the rows past k written before it (those epochs "
            "are trained again); otherwise the later row of an epoch wins. An "
            "aligned table by default."
        ),
    )
    history.add_argument("run_dir", metavar="RUN_DIR")
    history.add_argument("--run", metavar="ID", help="only the run with this id")
    out = history.add_mutually_exclusive_group()
    out.add_argument(
        "--csv", action="store_true", help="CSV on stdout: run, segment, columns"
    )
    out.add_argument("--json", action="store_true", help="JSON on stdout")
    out.add_argument(
        "--plot",
        metavar="FILE",
        help="save a plot of one run's metrics to FILE (the `plot` extra)",
    )
    summary = commands.add_parser(
        "summary",
        help=SUMMARY_HELP,
        description=(
            "Build the experiment's handle (nothing is trained, compiled or "
            "written to a run directory) and print its parameters per optimizer "
            "group with their bytes, and one optimizer step's FLOPs and bytes by "
            "XLA's cost analysis of the train batch's gradient, lowered only."
        ),
    )
    _experiment_arguments(summary)


def _experiment_arguments(parser: Any) -> None:
    parser.add_argument("experiment", metavar="path.py:Class")
    parser.add_argument(
        "--set",
        metavar="FIELD=VALUE",
        action="append",
        default=[],
        dest="sets",
        help=SET_HELP,
    )
    parser.add_argument("--preset", metavar="P", help="start from the preset P")


def run_command(args: argparse.Namespace) -> int:
    """Run `train`, `history` or `summary` with parsed arguments; the exit status."""
    if args.command == "history":
        return _history(args)
    try:
        e, keywords = experiment_from_args(args)
    except ConfigError as error:
        print(f"nitro {args.command}: {error}", file=sys.stderr)
        return 2
    try:
        return _train(args, e, keywords) if args.command == "train" else _summary(e)
    except NitroError as error:
        print(f"nitro {args.command}: {error}", file=sys.stderr)
        return 1


def experiment_from_args(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """The experiment `args.experiment` names with `args.sets` applied, and the run
    keywords among the sets.

    Raises:
        ConfigError: a malformed name or `--set`, a missing file or class, an
            unknown field (the nearest names given), a value not of the field's
            type, or one the experiment refuses.
    """
    from .agent.loader import build_experiment, experiment_class, parse_override_text
    from .agent.tools import CLIENT_KEYWORDS
    from .experiment.traits import field_names

    file_part, sep, class_name = str(args.experiment).rpartition(":")
    if not sep or not file_part.endswith(".py"):
        raise ConfigError(
            f"{args.experiment!r} is not of the form path/to/file.py:ClassName. Name "
            f"a Python file and the Experiment subclass in it."
        )
    path = Path(file_part).resolve()
    if not path.is_file():
        raise ConfigError(f"no experiment file {file_part!r} (looked at {path}).")
    cls = experiment_class(path.anchor, f"{path}:{class_name}")
    fields = field_names(cls)
    keywords_allowed = tuple(k for k in CLIENT_KEYWORDS if k != "resume")
    overrides: dict[str, Any] = {}
    keywords: dict[str, Any] = {}
    for item in args.sets:
        key, equals, text = item.partition("=")
        key = key.strip()
        if not equals or not key:
            raise ConfigError(f"--set takes FIELD=VALUE, got {item!r}.")
        if key in fields:
            overrides[key] = parse_override_text(cls, key, text)
        elif key in keywords_allowed:
            keywords[key] = _literal(text)
        else:
            try:
                parse_override_text(cls, key, text)
            except ConfigError as error:
                note = NOT_A_FIELD_NOTE.format(keywords=", ".join(keywords_allowed))
                raise ConfigError(f"{error}{note}") from error
    return build_experiment(cls, args.preset, overrides), keywords


def _literal(text: str) -> Any:
    """A run keyword's text as an int, a float, a bool, None or the text itself
    (Nitro's own checks then refuse a value of the wrong kind)."""
    word = text.strip()
    for parse in (int, float):
        try:
            return parse(word)
        except ValueError:
            pass
    lowered = word.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    return None if lowered in ("none", "null") else text


def _train(args: argparse.Namespace, e: Any, keywords: dict[str, Any]) -> int:
    from .run.config import check_settings
    from .run.handle import Nitro

    kwargs = dict(keywords)
    if args.run_dir is not None:
        kwargs["run_dir"] = args.run_dir
    if args.resume is not None:
        kwargs["resume"] = args.resume
    try:
        check_settings(e, kwargs)
    except ConfigError as error:
        print(f"nitro train: {error}", file=sys.stderr)
        return 2
    nitro = Nitro(e, **kwargs)
    nitro.train()
    print(nitro.history)
    run = nitro.checkpoint_run
    print(
        f"{type(e).__name__}: {nitro.stop_reason} at epoch {nitro.current_epoch}, "
        f"step {nitro.current_step}; run dir {nitro.run_dir}"
        + (f", run {run}" if run else "")
        + f" (`nitro history {nitro.run_dir}` shows every epoch across resumes)."
    )
    return 0


def _summary(e: Any) -> int:
    from .run.handle import Nitro

    with tempfile.TemporaryDirectory(prefix="nitro-summary-") as scratch:
        nitro = Nitro(e, run_dir=scratch, logger=None, checkpointer=None)
        try:
            print(nitro.summary())
        finally:
            nitro.release()
    return 0


def _history(args: argparse.Namespace) -> int:
    from .observe.history import MetricHistory
    from .observe.history_text import history_table, render_text
    from .observe.run_log import read_run_logs

    try:
        logs = read_run_logs(args.run_dir, run=args.run)
    except ConfigError as error:
        print(f"nitro history: {error}", file=sys.stderr)
        return 1
    if logs and logs[0].skipped:
        for line in logs[0].skipped:
            print(f"nitro history: skipped {line}", file=sys.stderr)
    selections = _selections(args.run_dir)
    tables = [
        (
            log,
            MetricHistory(
                _plain(log.rows), selection_metric=selections.get(log.run_id)
            ),
        )
        for log in logs
    ]
    if args.csv:
        writer = csv.writer(sys.stdout)
        columns = _union(h.columns for _, h in tables)
        writer.writerow(["run", "segment", *columns])
        for log, h in tables:
            for row, source in zip(h, log.rows, strict=True):
                values = ["" if row.get(c) is None else row[c] for c in columns]
                writer.writerow([log.run_id or "", source["segment"], *values])
        return 0
    if args.json:
        print(json.dumps({"runs": [_json_run(log) for log in logs]}, indent=1))
        return 0
    if args.plot:
        if len(tables) != 1:
            held = ", ".join(str(log.run_id) for log in logs) or "none"
            print(
                f"nitro history --plot draws one run; {args.run_dir} holds runs "
                f"{held}. Pass --run ID.",
                file=sys.stderr,
            )
            return 2
        try:
            tables[0][1].plot(args.plot)
        except NitroError as error:  # the `plot` extra missing, nothing to plot
            print(f"nitro history: {error}", file=sys.stderr)
            return 1
        print(f"Wrote {args.plot}.")
        return 0
    width = shutil.get_terminal_size((120, 40)).columns
    if not logs:
        print(f"No runs in {args.run_dir}/metrics.jsonl.")
    for index, (log, h) in enumerate(tables):
        if index:
            print()
        print(_heading(log))
        if len(h):
            print(render_text(history_table(h, len(h) + 8, width)))
    return 0


def _heading(log: Any) -> str:
    segments = f"{log.segments} segment{'s' if log.segments != 1 else ''}"
    resumed = (
        f", resumed from epoch {', '.join(str(e) for e in log.resumed_from)}"
        if log.resumed_from
        else ""
    )
    ended = f"; last finish: {log.status}" if log.status else "; no finish line"
    return f"run {log.run_id}: {len(log.rows)} epochs over {segments}{resumed}{ended}"


def _plain(rows: Any) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k != "segment"} for row in rows]


def _union(groups: Any) -> list[str]:
    seen: dict[str, None] = {}
    for columns in groups:
        seen.update(dict.fromkeys(columns))
    return list(seen)


def _json_run(log: Any) -> dict[str, Any]:
    return {
        "run": log.run_id,
        "segments": log.segments,
        "resumed_from": list(log.resumed_from),
        "status": log.status,
        "rows": list(log.rows),
    }


def _selections(run_dir: str) -> dict[str | None, tuple[str, str]]:
    """Each run's checkpoint selection (metric, mode) from the manifest, to mark
    its best epoch; {} when there is no readable manifest."""
    from .checkpoint.run_listing import runs

    try:
        summaries = runs(run_dir)
    except (NitroError, OSError):
        return {}
    return {
        s.id: (s.metric, s.mode)
        for s in summaries
        if s.metric is not None and s.mode in ("min", "max")
    }
