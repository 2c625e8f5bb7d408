"""The run-file subcommands of `sexpgpu` (and `nitro`): check, fmt, run, explain.

Exit status: 0 when every file is fine, 1 for coded errors (reader, evaluation,
knobs, order, contract, loader, shapes, run) or a file `fmt --check` would change,
2 for a usage error (a missing file, a malformed `--set`).
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
    "run": "train a run file on the engine",
    "explain": "show a run file's parameters, update groups, step and knob kinds",
}
"""The run-file verbs and their one-line help."""


def _selection_arguments(parser: Any, sweep: str | None) -> None:
    parser.add_argument("file", metavar="FILE")
    parser.add_argument("--variant", metavar="V", help="apply the variant V")
    parser.add_argument(
        "--set",
        metavar="KNOB=VALUE",
        action="append",
        default=[],
        dest="sets",
        help="override a knob (typed like its default)",
    )
    if sweep:
        parser.add_argument("--sweep", metavar="S", help=sweep)


def add_commands(commands: Any) -> None:
    """Add `check`, `fmt`, `run` and `explain` to an argparse subparsers object."""
    check = commands.add_parser(
        "check", help=VERBS["check"], description=VERBS["check"] + "."
    )
    _selection_arguments(check, "check every point of the sweep S")
    run = commands.add_parser(
        "run",
        help=VERBS["run"],
        description=VERBS["run"] + ". It ends with `done: N steps, train/loss X` "
        "and the counters.",
    )
    _selection_arguments(run, "run every point of the sweep S, one run dir each")
    run.add_argument("--steps", type=int, metavar="N", help="replace defrun's :steps")
    run.add_argument("--device", choices=("cpu",), help="run on this JAX platform")
    run.add_argument(
        "--run-dir", metavar="D", help="where checkpoints and logs go (runs/<file>)"
    )
    explain = commands.add_parser(
        "explain", help=VERBS["explain"], description=VERBS["explain"] + "."
    )
    _selection_arguments(explain, None)
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
    """Run a run-file verb with parsed arguments; the exit status."""
    files = args.files if args.command == "fmt" else [args.file]
    for path in files:
        if not os.path.isfile(path):
            print(f"sexpgpu {args.command}: no file {path!r}", file=sys.stderr)
            return 2
    if args.command == "fmt":
        return _fmt(args)
    sets = []
    for item in args.sets:
        knob, equals, value = item.partition("=")
        if not equals or not knob:
            print(
                f"sexpgpu {args.command}: --set takes KNOB=VALUE, got {item!r}",
                file=sys.stderr,
            )
            return 2
        sets.append((knob, value))
    verb = {"check": _check, "run": _run, "explain": _explain}[args.command]
    return verb(args, tuple(sets))


def _run(args: argparse.Namespace, sets: tuple[tuple[str, str], ...]) -> int:
    from .check import evaluate_checked
    from .knobs import Selection

    if args.steps is not None and args.steps < 1:
        print(f"sexpgpu run: --steps must be >= 1, got {args.steps}", file=sys.stderr)
        return 2
    if args.device:
        import jax

        jax.config.update("jax_platforms", args.device)
    from .running import run_file

    base = Selection(variant=args.variant, sets=sets)
    stem = os.path.splitext(os.path.basename(args.file))[0]
    root = args.run_dir or os.path.join("runs", stem)
    try:
        if not args.sweep:
            outcome = run_file(args.file, base, steps=args.steps, run_dir=root)
            print("\n".join(outcome.lines()))
            return 0
        points = evaluate_checked(args.file, base).knobs.points(args.sweep)
        rows = []
        for point in points:
            label = "-".join(f"{k}={v}" for k, v in point)
            outcome = run_file(
                args.file,
                Selection(base.variant, point, base.sets),
                steps=args.steps,
                run_dir=os.path.join(root, label),
            )
            print("\n".join(outcome.lines()))
            rows.append((label, outcome))
    except RunfileError as error:
        print(error, file=sys.stderr)
        return 1
    width = max(len(label) for label, _ in rows)
    print(f"sweep {args.sweep}: {len(rows)} runs")
    print(f"  {'point':<{width}}  steps  train/loss  run dir")
    for label, outcome in rows:
        print(
            f"  {label:<{width}}  {outcome.steps:>5}  {outcome.train_loss:>10.4f}  "
            f"{os.path.join(root, label)}"
        )
    return 0


def _explain(args: argparse.Namespace, sets: tuple[tuple[str, str], ...]) -> int:
    from .explain import explain_lines
    from .knobs import Selection

    try:
        lines = explain_lines(args.file, Selection(variant=args.variant, sets=sets))
    except RunfileError as error:
        print(error, file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


def _check(args: argparse.Namespace, sets: tuple[tuple[str, str], ...]) -> int:
    from .check import check_file, evaluate_checked
    from .knobs import Selection

    base = Selection(variant=args.variant, sets=sets)
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
