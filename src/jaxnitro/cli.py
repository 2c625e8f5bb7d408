"""The `nitro` (and `sexpgpu`) command line: one program, subcommands by feature."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ._version import __version__


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; subcommands are added as their features land."""
    parser = argparse.ArgumentParser(
        prog="nitro",
        description=(
            "jaxnitro: a training framework for JAX that compiles only when the "
            "graph changes. Subcommands (runs, serve, check, run, explain, fmt) "
            "arrive with their features."
        ),
    )
    parser.add_argument(
        "--version", action="version", version=f"jaxnitro {__version__}"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `nitro` and `sexpgpu` console scripts."""
    parser = build_parser()
    parser.parse_args(list(argv) if argv is not None else sys.argv[1:])
    parser.print_help()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
