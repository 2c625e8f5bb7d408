"""The `nitro` (and `sexpgpu`) command line: one program, subcommands by feature.

    nitro runs RUN_DIR    the runs a run directory holds, most recent first
    nitro ckpt PATH       a checkpoint's metadata, read from its header only
    nitro serve BUNDLE    an exported bundle over HTTP (`--host`, `--port`)
    sexpgpu check FILE    a run file's contract, knobs and shapes (nothing compiled)
    sexpgpu fmt FILE...   run files in the canonical layout

Exit status: 0 on success, 2 for a usage error (argparse's), 1 when the path is
missing or not a readable run directory or checkpoint (the reason on stderr).
The run-file verbs' statuses are in `jaxnitro.runfile.commands`.
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
            "graph changes, and `sexpgpu`, which checks and formats run files "
            "(s-expression experiment files). run, explain and serve arrive with "
            "their features."
        ),
    )
    parser.add_argument(
        "--version", action="version", version=f"jaxnitro {__version__}"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    runs = commands.add_parser(
        "runs",
        help="list the runs a run directory holds",
        description="The runs RUN_DIR's manifest holds, most recent first.",
    )
    runs.add_argument("run_dir", metavar="RUN_DIR")
    ckpt = commands.add_parser(
        "ckpt",
        help="show a checkpoint's metadata",
        description="A checkpoint's metadata, read from its header (no weights).",
    )
    ckpt.add_argument("path", metavar="PATH")
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
    from .runfile.commands import add_commands

    add_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `nitro` and `sexpgpu` console scripts."""
    called = os.path.basename(sys.argv[0]) if argv is None and sys.argv else ""
    parser = build_parser(called if called in ("nitro", "sexpgpu") else "nitro")
    args = parser.parse_args(list(argv) if argv is not None else sys.argv[1:])
    if args.command is None:
        parser.print_help()
        return 0
    try:
        if args.command in ("check", "fmt"):
            from .runfile.commands import run_command

            return run_command(args)
        if args.command == "runs":
            return _runs(args.run_dir)
        if args.command == "serve":
            return _serve(args)
        return _ckpt(args.path)
    except CheckpointError as error:
        print(f"nitro {args.command}: {error}", file=sys.stderr)
        return 1


def format_epochs(epochs: Sequence[int]) -> str:
    """Ascending epochs as ranges: `1-3, 5, 8-9`.

    Example:
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
    from .checkpoint.runs import runs

    if not os.path.isdir(run_dir):
        raise CheckpointError(f"No run directory at {run_dir!r}.")
    summaries = runs(run_dir)
    if not summaries:
        print(f"No checkpoints in {run_dir}.")
        return 0
    rows = [
        (
            s.id,
            str(s.checkpoints),
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
        widths = [max(len(r[i]) for r in [_HEADERS, *rows]) for i in range(7)]
        for row in [_HEADERS, *rows]:
            cells = (cell.ljust(w) for cell, w in zip(row, widths, strict=True))
            print("  ".join(cells).rstrip())
    return 0


def _print_rich(title: str, rows: Sequence[tuple[str, ...]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for header in _HEADERS:
        table.add_column(header)
    for row in rows:
        table.add_row(*row)
    Console().print(table)


def _serve(args: argparse.Namespace) -> int:
    from .export.server import serve

    try:
        serve(
            args.bundle,
            host=args.host,
            port=args.port,
            max_delay=args.max_delay_ms / 1e3,
        )
    except NitroError as error:  # a missing extra, a bundle load_bundle refuses
        print(f"nitro serve: {error}", file=sys.stderr)
        return 1
    return 0


def _ckpt(path: str) -> int:
    from .checkpoint.info import checkpoint_info

    info = checkpoint_info(path)
    print(path)
    _print_mapping(info, indent=2)
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
