"""`fmt`: the canonical layout, comments kept, the spec's examples fixed points."""

from __future__ import annotations

from pathlib import Path

import pytest

from jaxnitro.runfile.fmt import WIDTH, format_diff, format_program
from jaxnitro.runfile.reader import read_file, read_text

EXAMPLES = Path(__file__).parents[2] / "examples" / "runfiles"


def fmt(text: str) -> str:
    return format_program(read_text(text))


@pytest.mark.parametrize("name", ["minimal.sx", "realistic.sx", "gpt2.sx"])
def test_the_spec_examples_are_fixed_points(name):
    path = EXAMPLES / name
    text = path.read_text()
    assert format_program(read_file(str(path))) == text


def test_the_minimal_example_is_the_spec_text():
    spec = Path("/work/shared/spec/runfile.txt")
    if spec.exists():  # the spec page lives beside the repository, not in it
        assert (EXAMPLES / "minimal.sx").read_text().rstrip() in spec.read_text()


def test_a_form_that_fits_goes_on_one_line():
    assert fmt("(defvar   model\n   (gpt :vocab 32\n :layers 2))") == (
        "(defvar model (gpt :vocab 32 :layers 2))\n"
    )


def test_a_call_keeps_keyword_pairs_and_aligns_them():
    long = "(adamw :lr 0.001 :betas [0.9 0.95] :eps 1e-10 :weight-decay 0.10 " + (
        ':groups [(group (select "model.embed.*") :lr 0.3 :weight-decay 0.0)])'
    )
    assert fmt(long) == (
        "(adamw :lr 0.001\n"
        "       :betas [0.9 0.95]\n"
        "       :eps 1e-10\n"
        "       :weight-decay 0.10\n"
        '       :groups [(group (select "model.embed.*") :lr 0.3 :weight-decay 0.0)])\n'
    )


def test_definitions_indent_their_body_by_two():
    text = "(defun f (x) (let ((y (+ x 1))) " + " ".join(["(g y)"] * 14) + "))"
    out = fmt(text)
    assert out.startswith("(defun f (x)\n  (let ((y (+ x 1)))\n    (g y)\n    (g y)")
    assert all(len(line) <= WIDTH for line in out.splitlines())


def test_comments_stay_where_they_were():
    text = (
        ";;; file\n\n\n"
        "(defvar x ; the x\n"
        "  ;; own line\n"
        "  1)   ; after\n"
        "(f :a 1 ; one\n"
        "   :b 2)\n"
    )
    assert fmt(text) == (
        ";;; file\n\n"
        "(defvar x ; the x\n"
        "  ;; own line\n"
        "  1) ; after\n"
        "(f :a 1 ; one\n"
        "   :b 2)\n"
    )


def test_a_comment_last_in_a_form_moves_the_bracket_to_the_next_line():
    out = fmt("(list 1\n 2 ; two\n)")
    assert out == "(list 1\n      2 ; two\n)\n"
    assert fmt(out) == out


def test_a_comment_first_in_a_list():
    out = fmt("( ; c\n a b)")
    assert out == "( ; c\n a\n b)\n"
    assert read_text(out).shape() == read_text("( ; c\n a b)").shape()


def test_atoms_are_written_as_read():
    assert fmt('(f 0.10 1E5 "a\\tb")') == '(f 0.10 1E5 "a\\tb")\n'


def test_format_diff_shows_the_change():
    diff = format_diff("(a  b)\n", fmt("(a  b)"), "x.sx")
    assert "-(a  b)" in diff and "+(a b)" in diff and "x.sx (formatted)" in diff
    assert format_diff("(a b)\n", "(a b)\n", "x.sx") == ""


def test_empty_file():
    assert fmt("") == "" and fmt("\n\n") == ""
