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


def test_brackets_nest_at_most_max_nesting_deep():
    from jaxnitro.runfile.reader import MAX_NESTING

    deepest = "(a " * MAX_NESTING + ")" * MAX_NESTING
    assert len(read_text(deepest).forms) == 1
    text = "(defvar x\n  " + "(" * 10000 + ")" * 10000 + ")"
    with pytest.raises(RunfileError) as caught:
        read_text(text, "f.sx")
    assert caught.value.codes == ["E-READ-011"]
    rendered = str(caught.value)
    assert rendered.startswith(
        f"f.sx:2:{3 + MAX_NESTING - 1}: E-READ-011 brackets nested deeper than "
        f"{MAX_NESTING}: this `(` opens level {MAX_NESTING + 1}"
    )
    assert "fix: name the inner parts with (defvar ...)" in rendered
    vectors = "[" * (MAX_NESTING + 1) + "]" * (MAX_NESTING + 1)
    with pytest.raises(RunfileError, match=r"1:101: E-READ-011 .*this `\[`"):
        read_text(vectors)


@pytest.mark.parametrize(
    "text, needle",
    [
        ("(f " + "1" * 5000 + ")", "a number of 5000 characters; the limit is 256"),
        ("(f -" + "2" * 300 + ")", "a number of 301 characters"),
        ("(f " + "a" * 300 + ")", "a name of 300 characters"),
        ("(f :" + "k" * 300 + ")", "a name of 301 characters"),
    ],
)
def test_an_atom_longer_than_the_limit_is_coded_before_it_is_converted(text, needle):
    with pytest.raises(RunfileError) as caught:
        read_text(text, "f.sx")
    assert caught.value.codes == ["E-READ-012"]
    first, line, underline = str(caught.value).split("\n")[:3]
    assert first.startswith("f.sx:1:4: E-READ-012 ") and needle in first
    # A long line is shown as a window around the column, the atom underlined.
    assert len(line) < 130 and line.endswith("...")
    assert underline.startswith("     ^~~~")


def test_a_string_longer_than_the_limit_and_a_file_too_large():
    from jaxnitro.runfile.reader import MAX_FILE_BYTES, MAX_STRING_CHARS

    assert read_text('"' + "a" * MAX_STRING_CHARS + '"').forms[0].value.startswith("a")
    with pytest.raises(RunfileError, match=r"f.sx:1:4: E-READ-012 a string of more"):
        read_text('(f "' + "a" * (MAX_STRING_CHARS + 1) + '")', "f.sx")
    big = b"; " + b"x" * MAX_FILE_BYTES
    with pytest.raises(RunfileError) as caught:
        read_bytes(big, "big.sx")
    assert caught.value.codes == ["E-READ-012"]
    assert f"big.sx holds more than {MAX_FILE_BYTES} bytes" in str(caught.value)


def test_a_long_line_is_shown_as_a_window_around_the_error():
    text = "(f " + " ".join(["aa"] * 100) + " 'x " + " ".join(["bb"] * 100) + ")"
    with pytest.raises(RunfileError) as caught:
        read_text(text, "f.sx")
    _, line, underline, _ = str(caught.value).split("\n")
    assert line.startswith("  ...aa aa") and line.endswith("...")
    assert line[underline.index("^")] == "'"
