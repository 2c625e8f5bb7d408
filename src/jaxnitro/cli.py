"""The `nitro` (and `sexpgpu`) command line: one program, subcommands by feature.

    nitro runs DIR        the runs a run directory holds, most recent first; for a
                          folder of run directories, each one's runs; files
                          missing or damaged are marked
    nitro ckpt PATH       a checkpoint's metadata, read from its header only
    nitro ckpt DIR RUN WHICH   the same for the record a (run, which) pair names in
                          a run directory: RUN a run id, "latest" or "all"; WHICH
                          "latest" or "best" (as `weights=(run, which)` reads it)
    nitro ckpt --repair DIR   rewrite DIR's manifest.json from the records' headers
                          (--metric NAME --mode min|max: score the records added)
    nitro serve BUNDLE    an exported bundle over HTTP (`--host`, `--port`; request
                          limits `--max-body-mb`, `--max-rows`, `--max-input-mb`,
                          `--max-json-depth`)
    nitro mcp             the nitro_* agent tools over MCP on stdio (`--root DIR`,
                          `--max-runs N`; the `mcp` extra)
    nitro launch -n N SCRIPT [ARGS...]   N local processes of `python SCRIPT` as
                          one multi-process run on a loopback coordinator
                          (`--port`, `--heartbeat`, `--grace`, `--timeout`)
    nitro train FILE.py:CLASS   train a Python experiment (`--set FIELD=VALUE`,
                          `--preset`, `--resume auto`, `--run-dir`)
    nitro history DIR     every epoch of a run directory's runs, across resumes
                          (`--run ID`; `--csv`, `--json` or `--plot FILE`)
    nitro summary FILE.py:CLASS   parameters per group, bytes, a step's FLOPs
    sexpgpu check FILE    a run file's contract, knobs and shapes (nothing compiled)
    sexpgpu fmt FILE...   run files in the canonical layout
    sexpgpu run FILE      train a run file on the engine (`--steps --variant --set
                          --sweep --device --run-dir`)
    sexpgpu explain FILE  a run file's parameters, update groups, step, knob kinds

`nitro` with no arguments prints this help and exits 0: asking what the program does
is not a mistake. Exit status: 0 on success, 2 for a usage error (argparse's), 1 when
the path is missing or not a readable run directory or checkpoint (the reason on
stderr).
The run-file verbs' statuses are in `jaxnitro.runfile.commands`, the Python
experiment verbs' (train, history, summary) in `jaxnitro.commands`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from ._version import __version__
from .errors import CheckpointError, NitroError


def build_parser(prog: str = "nitro") -> argparse.ArgumentParser:
    """The argument parser; subcommands are added as their features land. `prog`:
    the name it was called by (`nitro` or `sexpgpu`), for its usage lines."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=(
            "jaxnitro: a training framework for JAX that compiles only when the "
            "graph changes, and `sexpgpu`, which checks, formats, explains and "
            "runs run files (s-expression experiment files); `train`, `history` "
            "and `summary` train, read back and size Python experiments; `serve` "
            "serves an exported bundle and `mcp` the agent tools."
        ),
    )
    parser.add_argument(
        "--version", action="version", version=f"jaxnitro {__version__}"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_runs(commands)
    _add_ckpt(commands, prog)
    _add_serve(commands)
    _add_mcp(commands)
    _add_launch(commands)
    from .commands import add_commands as add_experiment_commands
    from .runfile.commands import add_commands

    add_experiment_commands(commands)
    add_commands(commands)
    return parser


def _add_runs(commands: Any) -> None:
    """`nitro runs DIR`: the runs a run directory holds."""
    runs = commands.add_parser(
        "runs",
        help="list the runs a run directory holds",
        description="The runs RUN_DIR's manifest holds, most recent first.",
    )
    runs.add_argument("run_dir", metavar="DIR")


def _add_ckpt(commands: Any, prog: str) -> None:
    """`nitro ckpt`: a checkpoint's metadata, or `--repair` of a run
    directory's manifest. `prog`: the name in its usage line."""
    ckpt = commands.add_parser(
        "ckpt",
        help="show a checkpoint's metadata",
        usage=(
            f"{prog} ckpt [-h] PATH | DIR RUN WHICH | --repair DIR "
            "[--metric NAME --mode {{min,max}}]"
        ),
        description=(
            "A checkpoint's metadata, read from its header (no weights): the record "
            "at PATH, or the one a (RUN, WHICH) pair names in the run directory DIR "
            '(RUN: a run id, "latest" or "all"; WHICH: "latest" or "best").'
        ),
    )
    ckpt.add_argument("path", metavar="PATH")
    ckpt.add_argument("pair", nargs="*", metavar="RUN WHICH", help=argparse.SUPPRESS)
    ckpt.add_argument(
        "--repair",
        action="store_true",
        help=(
            "rewrite DIR's manifest.json from the records there (keeping what a "
            "readable manifest says of the files it lists)"
        ),
    )
    ckpt.add_argument(
        "--metric", help="with --repair: the metric that scores the records added"
    )
    ckpt.add_argument(
        "--mode", choices=("min", "max"), help="with --repair: which way is better"
    )


def _add_serve(commands: Any) -> None:
    """`nitro serve BUNDLE`: an exported bundle over HTTP, with its
    request limits."""
    serve = commands.add_parser(
        "serve",
        help="serve an exported bundle over HTTP (the `serve` extra)",
        description=(
            "Serve a StableHLO bundle written by export_model: POST "
            "/v1/models/NAME:predict, GET /v1/models/NAME (the manifest), GET "
            "/healthz. Concurrent requests are batched dynamically."
        ),
    )
    serve.add_argument("bundle", metavar="BUNDLE", help="the bundle's folder")
    serve.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: loopback)"
    )
    serve.add_argument("--port", type=int, default=8000, help="TCP port (8000)")
    serve.add_argument(
        "--max-delay-ms",
        type=float,
        default=5.0,
        help="how long a request waits for others to batch with (5 ms)",
    )
    serve.add_argument(
        "--max-body-mb",
        type=float,
        default=16.0,
        help="the largest request body, in MiB; larger ones get a 413 (16)",
    )
    serve.add_argument(
        "--max-rows",
        type=int,
        default=8192,
        help="the most rows (samples) one request may carry (8192)",
    )
    serve.add_argument(
        "--max-input-mb",
        type=float,
        default=64.0,
        help="the most MiB one request's inputs may decode to (64)",
    )
    serve.add_argument(
        "--max-json-depth",
        type=int,
        default=32,
        help="the deepest nesting of a JSON body (32)",
    )


def _add_mcp(commands: Any) -> None:
    """`nitro mcp`: the agent tools over MCP on stdio."""
    agent = commands.add_parser(
        "mcp",
        help="serve the nitro_* agent tools over MCP on stdio (the `mcp` extra)",
        description=(
            "An MCP server on stdin/stdout exposing nitro_* tools: start training, "
            "validation, evaluation, prediction and export as background runs, poll "
            "their status, stop them, read history. Experiments are named "
            "path/to/file.py:ClassName under --root; nothing outside it is read or "
            "written. Closing the connection stops the runs gracefully."
        ),
    )
    agent.add_argument(
        "--root", default=".", help="the folder experiments and runs live under (.)"
    )
    agent.add_argument(
        "--max-runs", type=int, default=2, help="background runs active at once (2)"
    )
    agent.add_argument(
        "--shutdown-timeout",
        type=float,
        default=60.0,
        help="seconds to wait for the runs to stop when the client leaves (60)",
    )


def _add_launch(commands: Any) -> None:
    """`nitro launch -n N SCRIPT`: N local processes of one
    multi-process run."""
    launch = commands.add_parser(
        "launch",
        help="run a script as N local processes of one multi-process run",
        description=(
            "Start N processes of `python SCRIPT ARGS...`, each with NITRO_COORDINATOR "
            "(127.0.0.1:PORT), NITRO_NUM_PROCESSES and NITRO_PROCESS_ID set, so the "
            "script's Nitro joins one jax.distributed run. Output is prefixed with "
            "the rank. When a process fails the others are stopped and its exit "
            "status is returned."
        ),
    )
    launch.add_argument(
        "-n", dest="n", type=int, required=True, help="the processes to start"
    )
    launch.add_argument(
        "--port", type=int, default=None, help="coordinator port (default: a free one)"
    )
    launch.add_argument(
        "--heartbeat",
        type=int,
        default=None,
        help="seconds a silent process may go before the others stop (30)",
    )
    launch.add_argument(
        "--grace",
        type=float,
        default=10.0,
        help="seconds a process may take to stop after SIGTERM (10)",
    )
    launch.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="stop every process after this many seconds (exit status 124)",
    )
    launch.add_argument(
        "script", nargs=argparse.REMAINDER, help="SCRIPT [ARGS...] (or -m MODULE)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `nitro` and `sexpgpu` console scripts."""
    called = os.path.basename(sys.argv[0]) if argv is None and sys.argv else ""
    parser = build_parser(called if called in ("nitro", "sexpgpu") else "nitro")
    args = parser.parse_args(list(argv) if argv is not None else sys.argv[1:])
    if args.command is None:
        parser.print_help()
        return 0
    if args.command == "ckpt" and len(args.pair) not in (0, 2):
        parser.error(
            f"ckpt takes PATH, or DIR RUN WHICH; got {len(args.pair) + 1} arguments "
            f"({' '.join([args.path, *args.pair])})."
        )
    if args.command == "ckpt" and args.repair and args.pair:
        parser.error(f"ckpt --repair takes DIR alone, not {' '.join(args.pair)}.")
    if args.command == "ckpt" and not args.repair and (args.metric or args.mode):
        parser.error("ckpt: --metric and --mode go with --repair.")
    try:
        if args.command in ("check", "fmt", "run", "explain"):
            from .runfile.commands import run_command

            return run_command(args)
        if args.command in ("train", "history", "summary"):
            from .commands import run_command as run_experiment_command

            return run_experiment_command(args)
        if args.command == "runs":
            return _runs(args.run_dir)
        if args.command == "serve":
            return _serve(args)
        if args.command == "mcp":
            return _mcp(args)
        if args.command == "launch":
            return _launch(args)
        if args.repair:
            return _repair(args.path, args.metric, args.mode)
        return _ckpt(args.path, *args.pair)
    except CheckpointError as error:
        print(f"nitro {args.command}: {error}", file=sys.stderr)
        return 1


def format_epochs(epochs: Sequence[int]) -> str:
    """Ascending epochs as ranges: `1-3, 5, 8-9`.

    Examples:
        >>> format_epochs([1, 2, 3, 5, 8, 9])
        '1-3, 5, 8-9'
    """
    values = list(epochs)
    parts: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        parts.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ", ".join(parts)


def _when(written: float) -> str:
    if not written:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(written))


_HEADERS = ("run", "ckpts", "epochs", "best", "metric", "last written", "parent")


def _runs(run_dir: str) -> int:
    from .checkpoint.run_listing import run_directories

    if not os.path.isdir(run_dir):
        raise CheckpointError(f"No run directory at {run_dir!r}.")
    found = run_directories(run_dir)
    if not found:
        print(f"No checkpoints in {run_dir}.")
        return 0
    for index, directory in enumerate(found):
        if index:
            print()
        _runs_table(directory, titled=found != [run_dir])
    return 0


def _runs_table(run_dir: str, *, titled: bool) -> None:
    """The runs table of one run directory; `titled`: headed by its path (a folder
    of run directories lists several)."""
    from .checkpoint.run_listing import runs

    summaries = runs(run_dir)
    if not summaries:
        print(f"No checkpoints in {run_dir}.")
        return
    rows = [
        (
            s.id,
            _count(s.checkpoints, len(s.missing), len(s.damaged)),
            format_epochs(s.epochs),
            "-" if s.best is None else f"{s.best:.6g}",
            "-" if s.metric is None else f"{s.metric}/{s.mode}",
            _when(s.written),
            "-" if s.parent is None else os.path.basename(s.parent),
        )
        for s in summaries
    ]
    if sys.stdout.isatty():
        _print_rich(f"Runs in {run_dir}", rows)
    else:
        if titled:
            print(f"{run_dir}:")
        widths = [max(len(r[i]) for r in [_HEADERS, *rows]) for i in range(7)]
        for row in [_HEADERS, *rows]:
            cells = (cell.ljust(w) for cell, w in zip(row, widths, strict=True))
            print("  ".join(cells).rstrip())
    for summary in summaries:
        for problem in summary.problems:
            print(f"run {summary.id}: {_problem_text(problem)}")


def _count(checkpoints: int, missing: int, damaged: int) -> str:
    """`3`, or `3 (1 missing, 1 damaged)`: the ckpts cell of a runs table."""
    marks = [f"{n} {what}" for n, what in ((missing, "missing"), (damaged, "damaged"))]
    marked = [mark for mark in marks if not mark.startswith("0 ")]
    return f"{checkpoints} ({', '.join(marked)})" if marked else str(checkpoints)


def _problem_text(problem: Any) -> str:
    """One line under the runs table for a listed file that is not its record."""
    from .checkpoint.integrity import DAMAGED, MISSING

    name = f"{problem.entry.file} (epoch {problem.entry.epoch})"
    if problem.kind == MISSING:
        return f"{name} is missing."
    if problem.kind == DAMAGED:
        return f"{name} is damaged: {problem.detail}"
    return f"{name} holds another record: {problem.detail}"


def _print_rich(title: str, rows: Sequence[tuple[str, ...]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for header in _HEADERS:
        table.add_column(header)
    for row in rows:
        table.add_row(*row)
    Console().print(table)


def _launch(args: argparse.Namespace) -> int:
    from .devices.launch import launch

    try:
        return launch(
            args.script,
            n=args.n,
            port=args.port,
            heartbeat_s=args.heartbeat,
            grace_s=args.grace,
            timeout_s=args.timeout,
        )
    except NitroError as error:
        print(f"nitro launch: {error}", file=sys.stderr)
        return 2


def _serve(args: argparse.Namespace) -> int:
    from .export.request_body import MIB, ServeLimits
    from .export.server import serve

    try:
        limits = ServeLimits(
            max_body_bytes=round(args.max_body_mb * MIB),
            max_rows=args.max_rows,
            max_input_bytes=round(args.max_input_mb * MIB),
            max_json_depth=args.max_json_depth,
        )
        serve(
            args.bundle,
            host=args.host,
            port=args.port,
            max_delay=args.max_delay_ms / 1e3,
            limits=limits,
        )
    except NitroError as error:  # a missing extra, a bundle load_bundle refuses
        print(f"nitro serve: {error}", file=sys.stderr)
        return 1
    return 0


def _mcp(args: argparse.Namespace) -> int:
    from .agent.server import serve

    try:
        left = serve(
            args.root,
            max_runs=args.max_runs,
            shutdown_timeout=args.shutdown_timeout,
        )
    except NitroError as error:  # a missing extra, a bad root or --max-runs
        print(f"nitro mcp: {error}", file=sys.stderr)
        return 1
    if left:
        print(
            f"nitro mcp: runs {', '.join(left)} were still running after "
            f"{args.shutdown_timeout:g} s; they end with the process.",
            file=sys.stderr,
        )
    return 0


def _ckpt(path: str, *pair: str) -> int:
    from .checkpoint.info import checkpoint_info, checkpoint_path

    if pair:
        path = checkpoint_path(path, pair[0], pair[1])
    elif os.path.isdir(path):
        raise CheckpointError(
            f"{path} is a directory, not a checkpoint file. Name a record in it with "
            f"a (run, which) pair, e.g. `nitro ckpt {path} latest best` or "
            f"`nitro ckpt {path} <run id> latest` (`nitro runs {path}` lists the "
            f"run ids), or pass a record's path."
        )
    info = checkpoint_info(path)
    print(path)
    _print_mapping(info, indent=2)
    return 0


def _repair(directory: str, metric: str | None, mode: str | None) -> int:
    from .checkpoint.lock import lock_run_dir
    from .checkpoint.lookup import runs_held
    from .checkpoint.manifest import manifest_path, repair_manifest

    if not os.path.isdir(directory):
        raise CheckpointError(f"No run directory at {directory!r}.")
    # Rewriting the manifest under a training process would lose its next save.
    lock = lock_run_dir(directory, purpose="manifest repair")
    try:
        entries, skipped = repair_manifest(directory, metric=metric, mode=mode)
    finally:
        if lock is not None:
            lock.release()
    print(
        f"Wrote {manifest_path(directory)}: {len(entries)} checkpoint(s); runs: "
        f"{runs_held(entries)}."
    )
    for line in skipped:
        print(f"nitro ckpt --repair: left out {line}", file=sys.stderr)
    return 0


def _print_mapping(values: dict[str, Any], indent: int) -> None:
    pad = " " * indent
    for key, value in values.items():
        if value is None:
            continue
        if isinstance(value, dict) and value:
            print(f"{pad}{key}:")
            _print_mapping(value, indent + 2)
        elif isinstance(value, str):
            print(f"{pad}{key}: {value}")
        else:
            print(f"{pad}{key}: {json.dumps(value)}")


if __name__ == "__main__":
    raise SystemExit(main())
