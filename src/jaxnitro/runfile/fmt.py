"""The canonical layout of a run file (`sexpgpu fmt`).

The rule, applied to every list and vector from the outside in:

1. A form that fits in `WIDTH` columns (its closing brackets included) and holds
   no comment is written on one line, items separated by one space.
2. Otherwise it is broken. Its items are grouped into units the way a call reads
   its arguments: from the end, a keyword and the value after it are one unit
   (`:lr 0.5`, `:dtype :i32`) for as long as such pairs continue; every other
   item is a unit of its own.
   - A definition form (`defvar`, `defun`, `let`, `fn`, `defknobs`, `defvariant`,
     `defsweep`, `defeval`, `cond`) keeps its head and its header (the name, the
     parameters, the bindings) on the first line; each body unit goes on its own
     line, indented two columns past the opening bracket.
   - A call `(f ...)` keeps its first unit beside `f`; each further unit goes on
     its own line, aligned with the first.
   - A vector, or a list that does not start with a symbol, keeps its first item
     beside the bracket; each further unit is aligned with it.
3. Comments are kept where they were: a comment after code stays at the end of
   that line, a comment on its own line stays on its own line (at the indentation
   of the items around it); a form holding a comment is always broken.
4. Numbers, strings and names are written exactly as they were read (`0.10` stays
   `0.10`); a blank line between top-level forms is kept (several become one);
   blank lines inside a form are dropped.

The layout is a function of the value tree, so `fmt` is idempotent.
"""

from __future__ import annotations

import difflib

from .syntax import Atom, Comment, Node, Program, Seq, is_symbol

WIDTH = 80
"""The column limit a one-line form must fit in."""

BODY_FORMS = {
    "defvar": 1,
    "defun": 2,
    "let": 1,
    "fn": 1,
    "defknobs": 0,
    "defvariant": 1,
    "defsweep": 1,
    "defeval": 1,
    "cond": 0,
}
"""Definition forms and how many header items stay beside the head."""


def format_program(program: Program) -> str:
    """The canonical text of a program, ending in a newline (empty for none).

    Examples:
        >>> from jaxnitro.runfile.reader import read_text
        >>> print(format_program(read_text("(defvar  x\\n  [1   2])  ; two")), end="")
        (defvar x [1 2]) ; two
    """
    out: list[str] = []
    for blank, form in zip(program.blank_before, program.forms, strict=True):
        if isinstance(form, Comment) and form.trailing and out:
            out[-1] += " " + form.text
            continue
        if blank:
            out.append("")
        out.extend(_layout(form, 0, 0))
    return "".join(line + "\n" for line in out)


def format_diff(old: str, new: str, name: str) -> str:
    """A unified diff from `old` to `new` (empty when they are equal)."""
    return "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True),
            new.splitlines(keepends=True),
            fromfile=name,
            tofile=f"{name} (formatted)",
        )
    )


def _flat(node: Node) -> str | None:
    """The one-line text of `node`, or None when it holds a comment."""
    if isinstance(node, Atom):
        return node.text
    if isinstance(node, Comment):
        return None
    assert isinstance(node, Seq)
    parts = [_flat(item) for item in node.items]
    if any(p is None for p in parts):
        return None
    close = ")" if node.bracket == "(" else "]"
    return node.bracket + " ".join(p for p in parts if p is not None) + close


def _layout(node: Node, col: int, tail: int) -> list[str]:
    """Lines of `node` written at column `col`, `tail` characters following it.

    The first line has no indentation (it continues a line); the others carry
    their full indentation.
    """
    if isinstance(node, Atom | Comment):
        return [node.text]
    assert isinstance(node, Seq)
    flat = _flat(node)
    if flat is not None and col + len(flat) + tail <= WIDTH:
        return [flat]
    return _broken(node, col, tail)


def _units(items: tuple[Node, ...]) -> list[tuple[Node, ...]]:
    """Items grouped as the evaluator reads arguments: from the end of the form,
    a keyword and the value after it are one unit (the value may be a keyword:
    `:dtype :i32`) for as long as such pairs continue; every other item is alone.
    A comment is alone and never splits or stops the pairs around it."""
    units: list[tuple[Node, ...]] = []
    pairing = True
    i = len(items) - 1
    while i >= 0:
        item = items[i]
        before = items[i - 1] if i > 0 else None
        if isinstance(item, Comment):
            units.append((item,))
            i -= 1
        elif pairing and isinstance(before, Atom) and before.kind == "keyword":
            units.append((before, item))
            i -= 2
        else:
            units.append((item,))
            pairing = False
            i -= 1
    return units[::-1]


def _unit_lines(unit: tuple[Node, ...], col: int, tail: int) -> list[str]:
    if len(unit) == 1:
        return _layout(unit[0], col, tail)
    key, value = unit
    assert isinstance(key, Atom)
    lines = _layout(value, col + len(key.text) + 1, tail)
    return [key.text + " " + lines[0], *lines[1:]]


def _broken(node: Seq, col: int, tail: int) -> list[str]:
    close = ")" if node.bracket == "(" else "]"
    items = node.items
    head = items[0] if items and not isinstance(items[0], Comment) else None
    rest = items[1:] if head is not None else items
    if head is None:
        lines, on_first, indent = [node.bracket], 0, col + 1
    else:
        head_lines = _layout(head, col + 1, 0)
        lines = [node.bracket + head_lines[0], *head_lines[1:]]
        if node.is_vector or not is_symbol(head):
            on_first, indent = 0, col + 1
        elif str(head.value) in BODY_FORMS:  # type: ignore[attr-defined]
            on_first, indent = BODY_FORMS[str(head.value)], col + 2  # type: ignore[attr-defined]
        else:
            on_first, indent = 1, col + 2 + len(str(head.value))  # type: ignore[attr-defined]
    units = _units(rest)
    ends_comment = False
    still_first = True
    for number, unit in enumerate(units):
        unit_tail = tail + 1 if number == len(units) - 1 else 0
        first = unit[0]
        if isinstance(first, Comment):
            if first.trailing and not ends_comment:
                lines[-1] += " " + first.text
            else:
                lines.append(" " * indent + first.text)
                still_first = False
            ends_comment = True
            continue
        if still_first and on_first > 0 and not ends_comment:
            at = (col if len(lines) == 1 else 0) + len(lines[-1]) + 1
            unit_lines = _unit_lines(unit, at, unit_tail)
            lines[-1] += " " + unit_lines[0]
            lines.extend(unit_lines[1:])
            on_first -= 1
        else:
            unit_lines = _unit_lines(unit, indent, unit_tail)
            lines.append(" " * indent + unit_lines[0])
            lines.extend(unit_lines[1:])
            still_first = False
        ends_comment = False
    if ends_comment:
        lines.append(" " * col + close)
    else:
        lines[-1] += close
    return lines
