"""The reader: every value with its position, every error coded and underlined."""

from __future__ import annotations

import pytest

from jaxnitro.runfile.reader import read_bytes, read_text
from jaxnitro.runfile.source import RunfileError
from jaxnitro.runfile.syntax import Atom, Comment, Seq


def shapes(text: str) -> list:
    return [form.shape() for form in read_text(text).forms]


def test_atoms_of_every_kind():
    [form] = read_text(
        '[42 -3 1e-10 0.10 "a\\"b\\n" :lr cross-entropy / <= true false nil]'
    ).forms
    assert isinstance(form, Seq) and form.is_vector
    assert [(a.kind, a.value) for a in form.items] == [
        ("int", 42),
        ("int", -3),
        ("float", 1e-10),
        ("float", 0.1),
        ("str", 'a"b\n'),
        ("keyword", "lr"),
        ("symbol", "cross-entropy"),
        ("symbol", "/"),
        ("symbol", "<="),
        ("bool", True),
        ("bool", False),
        ("nil", None),
    ]
    assert form.items[3].text == "0.10"  # the source text survives for fmt


def test_every_value_keeps_its_position():
    program = read_text('(defvar x\n  (gpt :vocab 32))\n"s"', "f.sx")
    defvar, string = program.forms
    assert (defvar.span.line, defvar.span.col) == (1, 1)
    gpt = defvar.items[2]
    assert (gpt.span.line, gpt.span.col) == (2, 3)
    vocab = gpt.items[1]
    assert (vocab.span.line, vocab.span.col, vocab.span.length) == (2, 8, 6)
    assert string.span.where == "f.sx:3:1"


def test_comments_are_kept_with_whether_code_precedes_them():
    program = read_text(";; head\n(a ; after a\n ;; own line\n b)\n\n(c) ; end\n")
    assert program.forms[0] == Comment(program.forms[0].span, ";; head", False)
    a = program.forms[1]
    assert [type(i).__name__ for i in a.items] == ["Atom", "Comment", "Comment", "Atom"]
    assert a.items[1].trailing and not a.items[2].trailing
    assert program.forms[3].trailing
    assert program.blank_before == (False, False, True, False)
    assert [v.shape() for v in a.values] == [("symbol", "a"), ("symbol", "b")]


@pytest.mark.parametrize(
    "text, code, where, underline, fix",
    [
        ("(defvar x\n  (gpt :vocab 32)", "E-READ-001", "f.sx:1:1", "^", "add `)`"),
        ("[1 2", "E-READ-001", "f.sx:1:1", "^", "add `]`"),
        ("(a))", "E-READ-002", "f.sx:1:4", "   ^", "remove it"),
        ("(a [b)", "E-READ-003", "f.sx:1:6", "     ^", "write `]` here"),
        ('(a "open', "E-READ-004", "f.sx:1:4", "   ^~~~~", 'close it with `"`'),
        ('"a\\qb"', "E-READ-005", "f.sx:1:3", "  ^~", "the escapes are"),
        ("(f 1.2.3)", "E-READ-006", "f.sx:1:4", "   ^~~~~", "numbers look like"),
        ("(f 'x)", "E-READ-007", "f.sx:1:4", "   ^", "there is no quote"),
        ("(f {:a 1})", "E-READ-007", "f.sx:1:4", "   ^", "there are no maps"),
        ("(f :)", "E-READ-008", "f.sx:1:4", "   ^", "`:` followed by a name"),
        ("(f a:b)", "E-READ-008", "f.sx:1:4", "   ^~~", "put a space"),
        ('(f "a\nb")', "E-READ-009", "f.sx:1:4", "   ^~", "write `\\n`"),
    ],
)
def test_reader_errors_are_coded_located_underlined_and_fixed(
    text, code, where, underline, fix
):
    with pytest.raises(RunfileError) as caught:
        read_text(text, "f.sx")
    assert caught.value.codes == [code]
    rendered = str(caught.value).split("\n")
    assert rendered[0].startswith(f"{where}: {code} ")
    assert rendered[2] == "  " + underline
    assert fix in rendered[3] and rendered[3].startswith("  fix: ")


def test_an_unclosed_paren_points_at_where_it_opened():
    text = "(defvar a 1)\n(defun f (x)\n  (let ((y x))\n    y)\n"
    with pytest.raises(RunfileError, match=r"f.sx:2:1: E-READ-001 unclosed `\(`"):
        read_text(text, "f.sx")


def test_bytes_that_are_not_utf8_are_a_coded_error():
    with pytest.raises(RunfileError, match=r"f.sx:2:3: E-READ-010 .*byte 0xff"):
        read_bytes(b"(a)\n(b\xff)", "f.sx")


def test_control_characters_are_refused():
    with pytest.raises(RunfileError) as caught:
        read_text("(a \x00)", "f.sx")
    assert caught.value.codes == ["E-READ-007"]
    assert "U+0000" in str(caught.value)
    with pytest.raises(RunfileError, match="E-READ-010 control character"):
        read_text('"a\x01"', "f.sx")


def test_atoms_compare_without_positions():
    first = read_text("(a 1)").forms[0]
    second = read_text("\n\n   (a\n 1)").forms[0]
    assert first == second and first.shape() == second.shape()
    assert isinstance(first.items[1], Atom)
