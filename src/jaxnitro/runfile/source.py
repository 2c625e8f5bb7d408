"""Source positions and the coded diagnostics every run-file error is reported as.

A diagnostic prints as `file:line:col: E-CODE message`, then the offending line
with the text underlined, then the fix where one is likely::

    minimal.sx:3:11: E-READ-001 unclosed `(`: the list opened here is never closed
      (defvar x (gpt :vocab 32
                ^
      fix: add `)` where the list ends
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ..errors import NitroError

SHOWN_COLUMNS = 120
"""The most characters of a source line a diagnostic shows (a window around the
error's column on a longer line)."""


@dataclass(frozen=True)
class Source:
    """A run file's text and the name its diagnostics print."""

    name: str
    text: str

    def line(self, number: int) -> str:
        """The 1-based line `number` of the text, without its newline."""
        lines = self.text.split("\n")
        return lines[number - 1] if 0 < number <= len(lines) else ""


@dataclass(frozen=True)
class Span:
    """Where a value was read: 1-based line and column, `length` characters."""

    source: Source = field(compare=False, repr=False)
    line: int
    col: int
    length: int = 1

    @property
    def where(self) -> str:
        """`file:line:col`."""
        return f"{self.source.name}:{self.line}:{self.col}"

    def at(self, argument: str | int) -> Span:
        """Where a call's argument was written: a keyword's value by its name
        (`"batch-size"`), a positional one by its index; this span when the
        argument's place is not known (see `CallSpan`)."""
        del argument
        return self


@dataclass(frozen=True)
class CallSpan(Span):
    """The span of a builtin's call that also knows where each argument was
    written, so a builtin points its diagnostics at the value it refuses."""

    arguments: Mapping[str | int, Span] = field(
        default_factory=dict, compare=False, repr=False
    )

    def at(self, argument: str | int) -> Span:
        return self.arguments.get(argument, self)


@dataclass(frozen=True)
class Diagnostic:
    """One coded error: `code` (`E-READ-001`), the message, where, and the fix."""

    code: str
    message: str
    span: Span | None = None
    fix: str | None = None

    def render(self) -> str:
        """The diagnostic as printed: location, code, message, underline, fix."""
        if self.span is None:
            head = f"{self.code} {self.message}"
            return head + (f"\n  fix: {self.fix}" if self.fix else "")
        span = self.span
        text = span.source.line(span.line).expandtabs(1)
        width = max(1, min(span.length, len(text) - span.col + 1))
        text, col, width = _window(text, span.col, width)
        lines = [f"{span.where}: {self.code} {self.message}"]
        if text.strip():
            lines.append("  " + text)
            lines.append("  " + " " * (col - 1) + "^" + "~" * (width - 1))
        if self.fix:
            lines.append(f"  fix: {self.fix}")
        return "\n".join(lines)


def _window(text: str, col: int, width: int) -> tuple[str, int, int]:
    """A line longer than `SHOWN_COLUMNS` cut to a window around `col` (`...`
    marking what is left out), with the column and underline width in it."""
    if len(text) <= SHOWN_COLUMNS:
        return text, col, width
    start = max(0, col - 1 - SHOWN_COLUMNS // 4)
    shown = text[start : start + SHOWN_COLUMNS]
    col -= start
    width = max(1, min(width, len(shown) - col + 1))
    if start:
        shown, col = "..." + shown, col + 3
    if start + SHOWN_COLUMNS < len(text):
        shown += "..."
    return shown, col, width


class RunfileError(NitroError):
    """One or more coded diagnostics about a run file.

    `str(error)` is every diagnostic rendered, one after the other; `codes` lists
    their codes in order (the tests match on them).
    """

    def __init__(self, diagnostics: Iterable[Diagnostic]) -> None:
        self.diagnostics = tuple(diagnostics)
        super().__init__("\n".join(d.render() for d in self.diagnostics))

    @property
    def codes(self) -> list[str]:
        """The diagnostics' codes, in the order they were found."""
        return [d.code for d in self.diagnostics]


def fail(
    code: str, message: str, span: Span | None = None, fix: str | None = None
) -> RunfileError:
    """A `RunfileError` holding one diagnostic (raise what it returns)."""
    return RunfileError([Diagnostic(code, message, span, fix)])


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """`count` and the noun in the number it takes, for messages.

    Examples:
        >>> counted(1, "graph"), counted(2, "micro-batch", "micro-batches")
        ('1 graph', '2 micro-batches')
    """
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


def near_names(name: str, candidates: Iterable[str]) -> list[str]:
    """The candidates close to `name` (a typo or a missing `-`), closest first."""
    import difflib

    return difflib.get_close_matches(name, list(candidates), n=3, cutoff=0.6)


def did_you_mean(name: str, candidates: Iterable[str]) -> str | None:
    """A fix suggesting the nearest candidate, or None when nothing is near."""
    near = near_names(name, candidates)
    if not near:
        return None
    return "did you mean " + " or ".join(f"`{n}`" for n in near) + "?"
