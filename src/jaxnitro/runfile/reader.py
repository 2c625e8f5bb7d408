"""The reader: run-file text to values with positions, or coded E-READ errors.

The language's surface: lists `( )`, vectors `[ ]`, strings `"..."` with the
escapes `\\n \\t \\r \\\\ \\"`, integers and floats (`1e-10`, `-3`, `0.10`),
keywords `:name`, symbols (`cross-entropy`, `/`, `<=`), `true`, `false`, `nil`, and
`;` comments to the end of the line. Nothing else: there is no quote, no reader
macro, no way to reach Python from the text.

The text is untrusted, so its size is bounded before anything is built from it: a
file holds at most `MAX_FILE_BYTES`, brackets nest at most `MAX_NESTING` deep, a
number, name or keyword is at most `MAX_ATOM_CHARS` characters and a string at most
`MAX_STRING_CHARS` (E-READ-011 for the nesting, E-READ-012 for a size). Each limit
is checked before the text it bounds is converted, so no Python limit (the
recursion depth, `int`'s 4300 digits) is ever reached. A number is a 64-bit
integer or a finite float (E-READ-013 for `1e999` or a 29-digit integer).
"""

from __future__ import annotations

import re

from .bounds import INT_MAX, INT_MIN, is_finite_number
from .source import Diagnostic, RunfileError, Source, Span, fail
from .syntax import Atom, Comment, Node, Program, Seq

CLOSERS = {"(": ")", "[": "]"}
NAME_CHARS = re.compile(r"[A-Za-z0-9\-_+*/<>=!?.%&$]*")
NUMBER = re.compile(r"[+-]?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?")
INTEGER = re.compile(r"[+-]?\d+")
DELIMITERS = set('()[]";') | set(" \t\r\n")
MAX_FILE_BYTES = 1 << 20
"""The largest run file read (1 MiB): run files are a few kilobytes."""
MAX_NESTING = 100
"""How deep brackets nest; the shipped examples nest 8 deep."""
MAX_ATOM_CHARS = 256
"""The longest number, name or keyword, in characters."""
MAX_STRING_CHARS = 4096
"""The longest string literal, in characters between its quotes (escapes as
written)."""
ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"'}
FOREIGN = {
    "'": "there is no quote: write (list ...) or a vector [ ... ]",
    "`": "there is no quasiquote: build values with (list ...)",
    ",": "there is no unquote, and items are separated by spaces, not commas",
    "#": "there are no reader macros",
    "{": "there are no maps: pass keyword arguments (f :name value)",
    "}": "there are no maps: pass keyword arguments (f :name value)",
    "@": "there is no splicing",
}


def read_text(text: str, name: str = "<string>") -> Program:
    """Read a whole run file's text.

    Raises:
        RunfileError: E-READ-* with the position of the offending text.

    Examples:
        >>> read_text("[1 :a] ; two").forms[0].shape()
        ('[', (('int', 1), ('keyword', 'a')))
    """
    _check_size(len(text), name, "characters")
    return _Reader(Source(name, text)).program()


def read_bytes(data: bytes, name: str = "<bytes>") -> Program:
    """Read a run file's bytes: UTF-8, or E-READ-010 at the first bad byte
    (E-READ-012 for more than `MAX_FILE_BYTES`)."""
    _check_size(len(data), name, "bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        good = data[: error.start].decode("utf-8")
        line = good.count("\n") + 1
        col = len(good) - (good.rfind("\n") + 1) + 1
        source = Source(name, good + "?")
        raise fail(
            "E-READ-010",
            f"the file is not UTF-8 text (byte 0x{data[error.start]:02x})",
            Span(source, line, col),
            "save the file as UTF-8",
        ) from None
    return read_text(text, name)


def read_file(path: str) -> Program:
    """Read the run file at `path` (its diagnostics name the path); at most
    `MAX_FILE_BYTES` are read, so a huge file is refused without loading it."""
    with open(path, "rb") as handle:
        data = handle.read(MAX_FILE_BYTES + 1)
    return read_bytes(data, path)


def _check_size(size: int, name: str, unit: str) -> None:
    if size > MAX_FILE_BYTES:
        raise fail(
            "E-READ-012",
            f"{name} holds more than {MAX_FILE_BYTES} {unit}, the limit of a run file",
            None,
            'split it: move definitions into a library (require "lib.sx" ...)',
        )


class _Reader:
    def __init__(self, source: Source) -> None:
        self.source = source
        self.text = source.text
        self.pos = 0
        self.line = 1
        self.col = 1
        self.last_code_line = 0  # the line the last non-comment token ended on
        self.depth = 0  # brackets open around the current position

    def span(self, line: int, col: int, length: int = 1) -> Span:
        return Span(self.source, line, col, length)

    def advance(self, count: int) -> None:
        for ch in self.text[self.pos : self.pos + count]:
            if ch == "\n":
                self.line += 1
                self.col = 1
            else:
                self.col += 1
        self.pos += count

    def skip_space(self) -> int:
        """Skip whitespace; the number of newlines skipped."""
        newlines = 0
        while self.pos < len(self.text) and self.text[self.pos] in " \t\r\n":
            newlines += self.text[self.pos] == "\n"
            self.advance(1)
        return newlines

    def program(self) -> Program:
        forms: list[Node] = []
        blanks: list[bool] = []
        while True:
            newlines = self.skip_space()
            if self.pos >= len(self.text):
                break
            if self.text[self.pos] in ")]":
                raise fail(
                    "E-READ-002",
                    f"unexpected `{self.text[self.pos]}`: nothing is open here",
                    self.span(self.line, self.col),
                    "remove it, or add the opening bracket it closes",
                )
            blanks.append(bool(forms) and newlines >= 2)
            forms.append(self.node())
        return Program(tuple(forms), tuple(blanks))

    def node(self) -> Node:
        ch = self.text[self.pos]
        line, col = self.line, self.col
        if ch == ";":
            end = self.text.find("\n", self.pos)
            end = len(self.text) if end < 0 else end
            body = self.text[self.pos : end].rstrip()
            trailing = self.last_code_line == line
            self.advance(end - self.pos)
            return Comment(self.span(line, col, len(body)), body, trailing)
        if ch in CLOSERS:
            return self.seq(ch)
        if ch == '"':
            node: Node = self.string()
        else:
            node = self.atom()
        self.last_code_line = self.line
        return node

    def seq(self, opener: str) -> Seq:
        line, col = self.line, self.col
        closer = CLOSERS[opener]
        if self.depth >= MAX_NESTING:
            raise fail(
                "E-READ-011",
                f"brackets nested deeper than {MAX_NESTING}: this `{opener}` "
                f"opens level {self.depth + 1}",
                self.span(line, col),
                "name the inner parts with (defvar ...) or (defun ...) and use "
                "the names",
            )
        self.depth += 1
        self.advance(1)
        self.last_code_line = line
        items: list[Node] = []
        while True:
            self.skip_space()
            if self.pos >= len(self.text):
                kind = "list" if opener == "(" else "vector"
                raise fail(
                    "E-READ-001",
                    f"unclosed `{opener}`: the {kind} opened here is never closed",
                    self.span(line, col),
                    f"add `{closer}` where the {kind} ends",
                )
            ch = self.text[self.pos]
            if ch in ")]":
                if ch != closer:
                    raise RunfileError(
                        [
                            Diagnostic(
                                "E-READ-003",
                                f"`{ch}` closes the `{opener}` opened at {line}:{col}",
                                self.span(self.line, self.col),
                                f"write `{closer}` here, or close the inner "
                                f"bracket first",
                            )
                        ]
                    )
                self.advance(1)
                self.last_code_line = self.line
                self.depth -= 1
                return Seq(self.span(line, col), opener, tuple(items))
            items.append(self.node())

    def string(self) -> Atom:
        line, col, start = self.line, self.col, self.pos
        self.advance(1)
        chars: list[str] = []
        while True:
            if self.pos >= len(self.text) or self.text[self.pos] == "\n":
                at_end = self.pos >= len(self.text)
                raise fail(
                    "E-READ-004" if at_end else "E-READ-009",
                    "unterminated string: the string opened here never ends"
                    if at_end
                    else "a string cannot span lines",
                    self.span(line, col, self.pos - start),
                    'close it with `"`'
                    if at_end
                    else "write `\\n` for a newline, "
                    'and close the string with `"` on this line',
                )
            if self.pos - start - 1 > MAX_STRING_CHARS:
                raise fail(
                    "E-READ-012",
                    f"a string of more than {MAX_STRING_CHARS} characters",
                    self.span(line, col, MAX_STRING_CHARS),
                    "a string holds a path, a name or a message: shorten it",
                )
            ch = self.text[self.pos]
            if ch == '"':
                self.advance(1)
                text = self.text[start : self.pos]
                return Atom(
                    self.span(line, col, len(text)), "str", "".join(chars), text
                )
            if ch == "\\":
                escape = self.text[self.pos + 1 : self.pos + 2]
                if escape not in ESCAPES:
                    raise fail(
                        "E-READ-005",
                        f"unknown escape `\\{escape}` in a string",
                        self.span(self.line, self.col, 2),
                        'the escapes are \\n \\t \\r \\\\ and \\"; write `\\\\` for a '
                        "backslash",
                    )
                chars.append(ESCAPES[escape])
                self.advance(2)
                continue
            if ch < " " and ch != "\t":
                raise fail(
                    "E-READ-010",
                    f"control character {ch!r} in a string",
                    self.span(self.line, self.col),
                    "remove it, or write it as an escape",
                )
            chars.append(ch)
            self.advance(1)

    def atom(self) -> Atom:
        line, col, start = self.line, self.col, self.pos
        end = start
        while end < len(self.text) and self.text[end] not in DELIMITERS:
            end += 1
        text = self.text[start:end]
        span = self.span(line, col, len(text))
        if len(text) > MAX_ATOM_CHARS:
            what = "number" if _is_number(text) else "name"
            raise fail(
                "E-READ-012",
                f"a {what} of {len(text)} characters; the limit is {MAX_ATOM_CHARS}",
                span,
                "numbers are 64-bit: write at most 19 digits, or a float such as 1e30"
                if what == "number"
                else "shorten the name",
            )
        if not NAME_CHARS.fullmatch(text.replace(":", "")):
            index = next(
                i
                for i, c in enumerate(text)
                if c != ":" and not NAME_CHARS.fullmatch(c)
            )
            bad = text[index]
            shown = bad if bad.isprintable() else f"U+{ord(bad):04X}"
            raise fail(
                "E-READ-007",
                f"`{shown}` is not part of the language (in {text!r})",
                self.span(line, col + index),
                FOREIGN.get(bad, "names use letters, digits and - _ + * / < > = ! ? ."),
            )
        self.advance(end - start)
        if text.startswith(":"):
            if len(text) == 1 or ":" in text[1:]:
                raise fail(
                    "E-READ-008",
                    f"malformed keyword `{text}`",
                    span,
                    "a keyword is `:` followed by a name, such as `:lr`",
                )
            return Atom(span, "keyword", text[1:], text)
        if ":" in text:
            raise fail(
                "E-READ-008",
                f"`:` inside the name `{text}`",
                span,
                "put a space before a keyword: `f :name`",
            )
        if _is_number(text):
            if INTEGER.fullmatch(text) or NUMBER.fullmatch(text):
                value = int(text) if INTEGER.fullmatch(text) else float(text)
                if not is_finite_number(value):
                    raise fail(
                        "E-READ-013",
                        f"the number `{text}` is out of range: integers are 64-bit "
                        f"({INT_MIN} .. {INT_MAX}) and floats finite (below 1.8e308)",
                        span,
                        "write a smaller number",
                    )
                return Atom(span, type(value).__name__, value, text)
            raise fail(
                "E-READ-006",
                f"malformed number `{text}`",
                span,
                "numbers look like 42, -3, 0.5, 1e-10 (a digit before the point)",
            )
        if text in ("true", "false"):
            return Atom(span, "bool", text == "true", text)
        if text == "nil":
            return Atom(span, "nil", None, text)
        return Atom(span, "symbol", text, text)


def _is_number(text: str) -> bool:
    """Whether an atom's text is read as a number (a digit first, or after a sign
    or a point)."""
    return text[:1].isdigit() or (text[:1] in ("+", "-", ".") and text[1:2].isdigit())
