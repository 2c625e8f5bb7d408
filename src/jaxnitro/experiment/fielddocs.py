"""Attribute docstrings: the string literal placed directly below a class field.

    class MyExp(Experiment):
        width: GraphConst[int] = 128
        \"\"\"Hidden width. Structural: changes the compiled graph.\"\"\"

Python discards these strings at run time, so they are read back from the class source
with `ast`. A class whose source is unavailable (defined in a REPL or by `exec`) simply
has no docs; `jaxnitro.field(doc=...)` works everywhere.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import dataclass


@dataclass(frozen=True)
class FieldSource:
    """Where a field is declared: its attribute docstring and its source line."""

    doc: str | None
    line: int


def read_field_sources(cls: type) -> dict[str, FieldSource]:
    """Map each annotated field declared in `cls`'s own body to its doc and line."""
    try:
        lines, first_line = inspect.getsourcelines(cls)
    except (OSError, TypeError):
        return {}
    try:
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except SyntaxError:
        return {}
    class_defs = [node for node in tree.body if isinstance(node, ast.ClassDef)]
    if not class_defs:
        return {}
    body = class_defs[0].body
    found: dict[str, FieldSource] = {}
    for index, node in enumerate(body):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        doc = None
        if index + 1 < len(body):
            following = body[index + 1]
            if (
                isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                doc = inspect.cleandoc(following.value.value)
        found[node.target.id] = FieldSource(doc, first_line + node.lineno - 1)
    return found
