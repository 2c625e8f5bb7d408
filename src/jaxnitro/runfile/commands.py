"""The run-file subcommands of `sexpgpu` (and `nitro`): `check` and `fmt`.

Exit status: 0 when every file is fine, 1 for coded errors (reader, evaluation,
knobs, order, contract, loader, shapes) or a file `fmt --check` would change, 2
for a usage error (a missing file, a malformed `--set`).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from .source import RunfileError

VERBS = {
    "check": "check a run file: contract, knobs and shapes, nothing compiled",
    "fmt": "lay run files out canonically (--check: diff, --write: in place)",
}
"""The run-file verbs and their one-line help."""


def add_commands(commands: Any) -> None:
    """Add `check` and `fmt` to an argparse subparsers object."""
    check = commands.add_parser(
        "check", help=VERBS["check"], description=VERBS["check"] + "."
    )
    check.add_argument("file", metavar="FILE")
    check.add_argument("--variant", metavar="V", help="apply the variant V")
    check.add_argument(
        "--set",
        metavar="KNOB=VALUE",
        action="append",
        default=[],
        dest="sets",
        help="override a knob (typed like its default)",
    )
    check.add_argument("--sweep", metavar="S", help="check every point of the sweep S")
    fmt = commands.add_parser(
        "fmt",
        help=VERBS["fmt"],
        description=VERBS["fmt"] + ". Without --check or --write the formatted text "
        "goes to stdout.",
    )
    fmt.add_argument("files", metavar="FILE", nargs="+")
    fmt.add_argument(
        "--check",
        action="store_true",
        help="print a diff and exit 1 when a file would change",
    )
    fmt.add_argument("--write", action="store_true", help="rewrite files in place")


def run_command(args: argparse.Namespace) -> int:
    """Run `check` or `fmt` with parsed arguments; the exit status."""
    files = [args.file] if args.command == "check" else args.files
    for path in files:
        if not os.path.isfile(path):
            print(f"sexpgpu {args.command}: no file {path!r}", file=sys.stderr)
            return 2
    if args.command == "check":
        return _check(args)
    return _fmt(args)


def _check(args: argparse.Namespace) -> int:
    from .check import check_file, evaluate_checked
    from .knobs import Selection

    sets = []
    for item in args.sets:
        knob, equals, value = item.partition("=")
        if not equals or not knob:
            print(
                f"sexpgpu check: --set takes KNOB=VALUE, got {item!r}", file=sys.stderr
            )
            return 2
        sets.append((knob, value))
    base = Selection(variant=args.variant, sets=tuple(sets))
    try:
        points: list[tuple[tuple[str, Any], ...]] = [()]
        if args.sweep:
            points = evaluate_checked(args.file, base).knobs.points(args.sweep)
        for point in points:
            report = check_file(args.file, Selection(base.variant, point, base.sets))
            label = " ".join(f"{k}={v}" for k, v in point)
            print(report.line() + (f" ({label})" if label else ""))
    except RunfileError as error:
        print(error, file=sys.stderr)
        return 1
    return 0


def _fmt(args: argparse.Namespace) -> int:
    from .fmt import format_diff, format_program
    from .reader import read_file

    status = 0
    for path in args.files:
        try:
            new = format_program(read_file(path))
        except RunfileError as error:
            print(error, file=sys.stderr)
            status = 1
            continue
        with open(path, encoding="utf-8") as handle:
            old = handle.read()
        if args.check and new != old:
            print(format_diff(old, new, path), end="")
            status = 1
        if args.write and new != old:
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(new)
        if not args.check and not args.write:
            print(new, end="")
    return status
