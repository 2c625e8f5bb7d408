"""The values a run file evaluates to, beside numbers, strings, booleans and nil.

Lists and vectors evaluate to tuples. A keyword is a `Keyword`; a function is a
`Closure` (written with `defun` or `fn`) or a `Builtin` (the core and the standard
modules). The standard library's declarations (loaders, models, optimizers) are
frozen dataclasses defined beside their constructors.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .source import Span


@dataclass(frozen=True)
class Keyword:
    """A keyword value `:name`."""

    name: str

    def __str__(self) -> str:
        return ":" + self.name


@dataclass(frozen=True)
class Closure:
    """A function written in the run file: parameters, body, defining scope."""

    name: str
    params: tuple[str, ...]
    body: tuple[Any, ...]  # syntax nodes
    env: Any = field(compare=False, repr=False)
    span: Span | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Builtin:
    """A function of the core or a standard module.

    `impl(args, kwargs, span)` receives evaluated positional arguments and keyword
    arguments (names as written, without `:`); `keywords` lists the keywords it
    accepts (None: any), `required` those it needs; `arity` is (min, max)
    positional arguments, max None for any number.
    """

    name: str
    impl: Callable[[list[Any], dict[str, Any], Span], Any] = field(repr=False)
    arity: tuple[int, int | None] = (0, None)
    keywords: tuple[str, ...] | None = ()
    required: tuple[str, ...] = ()
    doc: str = ""


Function = Closure | Builtin


class Poisoned:
    """The value of a name whose definition failed, while `check` goes on to
    report every error: the failure is reported once, and a use of the name is
    skipped quietly (`SkippedError`) instead of reported again as undefined."""

    kind = "a name whose definition failed"


POISONED = Poisoned()
"""The one `Poisoned` value."""


class SkippedError(Exception):
    """An evaluation that met a `Poisoned` name: the error that poisoned it is
    already reported, so this one says nothing new. Only an evaluator that
    collects its errors (`Evaluator(..., collect=True)`) raises it, and it never
    leaves `check`."""


def kind_of(value: Any) -> str:
    """The kind of a value as diagnostics name it (`a function of 2 arguments`)."""
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Keyword):
        return f"the keyword {value}"
    if isinstance(value, tuple):
        return "a list"
    if isinstance(value, Closure):
        count = len(value.params)
        return f"a function of {count} argument{'s' if count != 1 else ''}"
    if isinstance(value, Builtin):
        return f"the function `{value.name}`"
    describe = getattr(value, "kind", None)
    if isinstance(describe, str):
        return describe
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"an array {value.dtype}{list(value.shape)}"
    return type(value).__name__


def show(value: Any) -> str:
    """A value as the run file would write it (for messages)."""
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, tuple):
        return "[" + " ".join(show(v) for v in value) + "]"
    if isinstance(value, Closure | Builtin):
        return f"<function {value.name}>"
    return str(value)


def keyword_list(value: Any) -> Mapping[str, Any] | None:
    """A `(list :a 1 :b 2)` value as a mapping, or None when it is not one."""
    if not isinstance(value, tuple) or len(value) % 2:
        return None
    keys = value[::2]
    if not all(isinstance(k, Keyword) for k in keys):
        return None
    return {k.name: v for k, v in zip(keys, value[1::2], strict=True)}
