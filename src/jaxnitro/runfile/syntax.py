"""The values the reader produces: each keeps its source position.

Atoms keep the text they were written as (`0.10` stays `0.10` through `fmt`);
lists and vectors keep their items, comments included, so `fmt` can lay them out
again. `blank_before` records a blank line before a top-level form.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .source import Span


@dataclass(frozen=True)
class Node:
    """Base of every value read from a run file."""

    span: Span = field(compare=False, repr=False)

    def shape(self) -> Any:
        """The value without positions: what two equal programs share."""
        raise NotImplementedError


@dataclass(frozen=True)
class Atom(Node):
    """A number, string, keyword, symbol, boolean or nil.

    `kind` is one of `int`, `float`, `str`, `keyword`, `symbol`, `bool`, `nil`;
    `value` is the Python value (a keyword's and a symbol's name, without `:`);
    `text` is the source text.
    """

    kind: str
    value: Any
    text: str

    def shape(self) -> Any:
        return (self.kind, self.value)


@dataclass(frozen=True)
class Comment(Node):
    """A `;` comment, its text from the `;`; `trailing` when code precedes it."""

    text: str
    trailing: bool = False

    def shape(self) -> Any:
        return ("comment", self.text, self.trailing)


@dataclass(frozen=True)
class Seq(Node):
    """A list `( )` or a vector `[ ]`; `items` includes its comments."""

    bracket: str  # "(" or "["
    items: tuple[Node, ...]

    @property
    def values(self) -> tuple[Node, ...]:
        """The items without comments."""
        return tuple(i for i in self.items if not isinstance(i, Comment))

    @property
    def is_vector(self) -> bool:
        """True for `[ ]`."""
        return self.bracket == "["

    def shape(self) -> Any:
        return (self.bracket, tuple(i.shape() for i in self.items))


@dataclass(frozen=True)
class Program:
    """A whole file: its top-level forms (comments included), in order.

    `blank_before[i]` is True when a blank line precedes `forms[i]`.
    """

    forms: tuple[Node, ...]
    blank_before: tuple[bool, ...]

    @property
    def values(self) -> tuple[Node, ...]:
        """The top-level forms without comments."""
        return tuple(f for f in self.forms if not isinstance(f, Comment))

    def shape(self) -> Any:
        """The program without positions, blank lines between forms included."""
        return tuple(
            (blank, f.shape())
            for blank, f in zip(self.blank_before, self.forms, strict=True)
        )


def is_symbol(node: Node, name: str | None = None) -> bool:
    """True when `node` is a symbol (named `name`, when given)."""
    return (
        isinstance(node, Atom)
        and node.kind == "symbol"
        and (name is None or node.value == name)
    )


def head_name(node: Node) -> str | None:
    """The symbol a list starts with (`defvar` for `(defvar x 1)`), else None."""
    if isinstance(node, Seq) and not node.is_vector and node.values:
        first = node.values[0]
        if is_symbol(first):
            return str(first.value)  # type: ignore[attr-defined]
    return None
