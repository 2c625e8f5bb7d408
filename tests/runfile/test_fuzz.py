"""Fuzzing `check` and `fmt` with random and mutated run files (Hypothesis).

Whatever the text, `check` and `fmt` end in a coded `RunfileError` or succeed:
never a Python exception (`RecursionError`, `ValueError`, `OverflowError`, ...).
The mutated files start from the shipped examples, so most mutations land deep in
a file that otherwise checks: in a model's arguments, a loader, an optimizer.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxnitro.runfile.check import check_file
from jaxnitro.runfile.fmt import format_program
from jaxnitro.runfile.reader import read_text
from jaxnitro.runfile.source import RunfileError

EXAMPLES = Path(__file__).parents[2] / "examples" / "runfiles"
SHIPPED = [(EXAMPLES / n).read_text() for n in ("minimal.sx", "realistic.sx")]
CODE = re.compile(r"E-[A-Z]+-\d{3}")
FUZZ = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)

FRAGMENTS = [
    "(",
    ")",
    "[",
    "]",
    '"',
    ";",
    ":",
    "'",
    "\x00",
    "é",
    " ",
    "\n",
    "-",
    "(" * 300,
    ")" * 5,
    "[" * 150 + "]" * 150,
    "9" * 5000,
    '"' + "a" * 5000 + '"',
    "1.2.3",
    "(defvar",
    "(let ((a 1)) a)",
    "()",
    "(f 1 2)",
]
"""Text inserted at random places: brackets, quotes, deep nesting, huge literals."""

ATOMS = [
    "0",
    "-1",
    "2.5",
    "1e-3",
    '"x"',
    ":kw",
    "nil",
    "true",
    "cross-entropi",
    "list",
    "[1 2]",
    "(list :a 1)",
    "1e999",
    "9" * 30,
    "(* 1e300 1e300)",
    "(+ 9223372036854775807 1)",
    "4294967296",
    "100000",
    "99999999",
    "1024",
]
"""What a token of a shipped file is replaced with."""

TOKEN = re.compile(r'"[^"\n]*"|[^\s()\[\]";]+')


@st.composite
def mutated(draw: st.DrawFn) -> str:
    """A shipped example with one to three mutations (delete, insert, replace a
    token, duplicate a span)."""
    text = draw(st.sampled_from(SHIPPED))
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(text)))
        kind = draw(st.sampled_from(["delete", "insert", "replace", "duplicate"]))
        if kind == "delete":
            text = text[:at] + text[at + draw(st.integers(1, 20)) :]
        elif kind == "insert":
            text = text[:at] + draw(st.sampled_from(FRAGMENTS)) + text[at:]
        elif kind == "duplicate":
            end = min(len(text), at + draw(st.integers(1, 40)))
            text = text[:end] + text[at:end] + text[end:]
        else:
            tokens = list(TOKEN.finditer(text))
            token = tokens[draw(st.integers(0, len(tokens) - 1))]
            text = (
                text[: token.start()]
                + draw(st.sampled_from(ATOMS))
                + text[token.end() :]
            )
    return text


random_text = st.lists(
    st.sampled_from(list('()[]";:\\ \n-.e1a') + ["(gpt", "(defvar x", "9" * 40]),
    max_size=60,
).map("".join)


def _check_and_fmt(text: str, path: Path) -> None:
    path.write_text(text, encoding="utf-8")
    for action in (
        lambda: check_file(str(path)),
        lambda: format_program(read_text(text)),
    ):
        try:
            action()
        except RunfileError as error:
            assert error.codes and all(CODE.fullmatch(c) for c in error.codes)
            assert str(error)  # every diagnostic renders


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@FUZZ
@given(mutated())
def test_mutated_examples_give_coded_errors_only(fuzz_dir: Path, text: str) -> None:
    _check_and_fmt(text, fuzz_dir / "mutated.sx")


@FUZZ
@given(random_text)
def test_random_text_gives_coded_errors_only(fuzz_dir: Path, text: str) -> None:
    _check_and_fmt(text, fuzz_dir / "random.sx")
