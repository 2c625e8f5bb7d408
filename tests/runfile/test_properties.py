"""Property tests of the reader and the formatter (Hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from jaxnitro.runfile.fmt import format_program
from jaxnitro.runfile.reader import read_bytes, read_text
from jaxnitro.runfile.source import RunfileError

SETTINGS = settings(max_examples=100, deadline=None)

names = st.from_regex(r"[a-z][a-z0-9\-]{0,8}|[+\-*/<>=]|<=", fullmatch=True)
numbers = st.one_of(
    st.integers(-(10**6), 10**6).map(str),
    st.from_regex(r"-?[0-9]{1,3}\.[0-9]{1,3}([eE]-?[0-9])?", fullmatch=True),
    st.from_regex(r"[0-9][eE]-?[0-9]{1,2}", fullmatch=True),
)
strings = st.lists(
    st.one_of(
        st.sampled_from(["\\n", "\\t", '\\"', "\\\\"]),
        st.characters(min_codepoint=32, max_codepoint=0x2FF, exclude_characters='"\\'),
    ),
    max_size=12,
).map(lambda parts: '"' + "".join(parts) + '"')
atoms = st.one_of(
    names,
    names.map(lambda n: ":" + n.lstrip("+-*/<>=") if n[0].isalpha() else ":k"),
    numbers,
    strings,
    st.sampled_from(["true", "false", "nil"]),
)
comments = st.from_regex(r";[ -~]{0,20}", fullmatch=True).map(str.rstrip)
spaces = st.sampled_from([" ", "  ", "\n", "\n  ", "\n\n"])


@st.composite
def items(draw, depth: int) -> str:
    if depth == 0 or draw(st.integers(0, 2)) == 0:
        return draw(atoms)
    opener, closer = draw(st.sampled_from([("(", ")"), ("[", "]")]))
    parts: list[str] = []
    for _ in range(draw(st.integers(0, 5))):
        if draw(st.integers(0, 5)) == 0:  # a comment, then the line must end
            parts.append(draw(comments) + "\n")
        else:
            parts.append(draw(items(depth - 1)) + draw(spaces))
    return opener + "".join(parts) + closer


@st.composite
def programs(draw) -> str:
    forms = []
    for _ in range(draw(st.integers(0, 4))):
        form = draw(items(3))
        if draw(st.integers(0, 3)) == 0:
            form += " " + draw(comments)
        forms.append(form + draw(st.sampled_from(["\n", "\n\n", "\n\n\n"])))
    return "".join(forms)


@SETTINGS
@given(programs())
def test_fmt_keeps_the_value_tree_and_is_a_fixed_point(text):
    program = read_text(text)
    formatted = format_program(program)
    again = read_text(formatted)
    assert again.shape() == program.shape()
    assert format_program(again) == formatted


syntax_chars = st.sampled_from(list('()[]";:\\ \n\t-.e1a') + ["\x00", "é", "'"])


@SETTINGS
@given(st.one_of(st.binary(max_size=64), st.lists(syntax_chars, max_size=40)))
def test_random_input_never_crashes_the_reader(data):
    raw = data if isinstance(data, bytes) else "".join(data).encode()
    try:
        read_bytes(raw, "random.sx")
    except RunfileError as error:
        assert error.codes and all(c.startswith("E-READ-") for c in error.codes)
        assert str(error).startswith("random.sx:")
