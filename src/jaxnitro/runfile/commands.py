"""The run-file subcommands of `sexpgpu` (and `nitro`): check, fmt, run, explain.

Exit status: 0 when every file is fine, 1 for coded errors (reader, evaluation,
knobs, order, contract, loader, shapes, run) or a file `fmt --check` would change,
2 for a usage error (a missing file, a malformed `--set`), 130 when Ctrl+C stopped
it, 70 for an internal error (E-INTERNAL-001, a bug in jaxnitro). No user error
prints a Python traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

from ..observe.number_format import format_number
from .source import RunfileError, counted, fail

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
    run.add_argument(
        "--resume",
        choices=("auto",),
        help="auto: continue the latest run of this file in the run dir (a new "
        "run when it holds none), as the Python API's resume='auto'",
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
        return _guarded(args, lambda: _fmt(args))
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
    return _guarded(args, lambda: verb(args, tuple(sets)))


INTERRUPTED = 130
"""The exit status of a verb stopped by Ctrl+C (128 + SIGINT)."""
INTERNAL = 70
"""The exit status of an internal error (EX_SOFTWARE): a bug, not the file's."""


def _guarded(args: argparse.Namespace, verb: Callable[[], int]) -> int:
    """Run `verb`; every error ends in a coded message and a non-zero status.

    A run file's own errors are `RunfileError`s. What the engine refuses while the
    run trains (a diverged loss, a locked or foreign run dir), a file or folder
    the run cannot read or write, and a device out of memory are coded here
    (E-RUN-008 to E-RUN-011), so no user error prints a Python traceback. Anything
    else is a bug in jaxnitro: E-INTERNAL-001 with the traceback saved to a file.
    """
    from ..errors import DivergenceError, NitroError

    path = args.file if args.command != "fmt" else " ".join(args.files)
    try:
        return verb()
    except RunfileError as error:
        found: RunfileError = error
    except DivergenceError as error:
        found = fail(
            "E-RUN-008",
            f"{path}: the training diverged: {error}",
            None,
            "lower the learning rate (:lr, or --set of its knob), then run again",
        )
    except NitroError as error:
        found = fail(
            "E-RUN-009",
            f"{path}: the engine refused the run: {error}",
            None,
            "follow the engine's message; --run-dir D starts the run in another folder",
        )
    except MemoryError:
        found = _out_of_memory(path, "the host")
    except OSError as error:
        where = f" ({error.filename})" if error.filename else ""
        found = fail(
            "E-RUN-010",
            f"{path}: cannot read or write a file of the run{where}: "
            f"{error.strerror or error}",
            None,
            "check the path and its permissions, and the free disk space",
        )
    except KeyboardInterrupt:
        print(f"sexpgpu {args.command}: interrupted", file=sys.stderr)
        return INTERRUPTED
    except Exception as error:  # noqa: BLE001 - the last resort, see the docstring
        if "RESOURCE_EXHAUSTED" in str(error):
            found = _out_of_memory(path, "the device")
        else:
            print(_internal(args.command, error), file=sys.stderr)
            return INTERNAL
    print(found, file=sys.stderr)
    return 1


def _out_of_memory(path: str, where: str) -> RunfileError:
    return fail(
        "E-RUN-011",
        f"{path}: {where} ran out of memory",
        None,
        "make the model or the batch smaller (:batch-size, :microbatches for "
        "the same records a step with smaller batches), or use :precision :bf16",
    )


def _internal(command: str, error: Exception) -> str:
    """E-INTERNAL-001: the error in one line, its traceback saved to a file."""
    import tempfile
    import traceback

    with tempfile.NamedTemporaryFile(
        "w", prefix="sexpgpu-", suffix=".traceback.txt", delete=False
    ) as handle:
        traceback.print_exception(error, file=handle)
    return (
        f"E-INTERNAL-001 sexpgpu {command} failed inside jaxnitro, not in the run "
        f"file: {type(error).__name__}: {error}\n"
        f"  fix: please report it with the traceback saved in {handle.name}"
    )


def _run(args: argparse.Namespace, sets: tuple[tuple[str, str], ...]) -> int:
    from .check import evaluate_checked
    from .knobs import Selection

    if args.steps is not None and args.steps < 1:
        print(f"sexpgpu run: --steps must be >= 1, got {args.steps}", file=sys.stderr)
        return 2
    if args.device:
        import jax

        jax.config.update("jax_platforms", args.device)
    from .engine import default_run_dir
    from .running import run_file

    base = Selection(variant=args.variant, sets=sets)
    root = args.run_dir or default_run_dir(args.file)
    resume = args.resume == "auto"

    def announce(line: str) -> None:
        print(line, flush=True)

    try:
        if not args.sweep:
            outcome = run_file(
                args.file,
                base,
                steps=args.steps,
                run_dir=root,
                resume=resume,
                announce=announce,
            )
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
                resume=resume,
                announce=announce,
            )
            print("\n".join(outcome.lines()))
            rows.append((label, outcome))
    except RunfileError as error:
        print(error, file=sys.stderr)
        return 1
    width = max(len(label) for label, _ in rows)
    print(f"sweep {args.sweep}: {counted(len(rows), 'run')}")
    print(f"  {'point':<{width}}  steps  train/loss  run dir")
    for label, outcome in rows:
        print(
            f"  {label:<{width}}  {outcome.steps:>5}  {_loss(outcome.train_loss):>10}  "
            f"{os.path.join(root, label)}"
        )
    return 0


def _loss(loss: float | None) -> str:
    return "-" if loss is None else format_number(loss)


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
