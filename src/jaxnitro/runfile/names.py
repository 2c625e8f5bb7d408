"""Undefined names found without running anything: function bodies included.

Evaluation reports an undefined name only when it evaluates it, and a function's
body is evaluated only when the function is called: `(cross-entropi ...)` inside
`objective` would wait for the shape trace, which needs every other part of the
contract. `undefined_names` walks every top-level form as the evaluator would
read it (`defun` and `fn` bind their parameters, `let` its names in order) and
reports each symbol that no scope binds, with its position, as evaluation would
(E-EVAL-001 with the nearest names, E-EVAL-002 for an escape to Python).

Example:
    >>> from jaxnitro.runfile.reader import read_text
    >>> from jaxnitro.runfile.special import Scope
    >>> program = read_text("(defun f (a) (let ((b a)) (+ b c)))")
    >>> [d.message for d in undefined_names(program, Scope({"+": None}))]
    ['`c` is not defined']
"""

from __future__ import annotations

from .evaluator import TOP_LEVEL, unbound
from .source import Diagnostic, RunfileError
from .special import SPECIAL, Scope
from .syntax import Atom, Node, Program, Seq, head_name, is_symbol


def undefined_names(program: Program, scope: Scope) -> list[Diagnostic]:
    """Every symbol of `program` that neither `scope` (the file's, after its
    evaluation) nor an enclosing parameter or `let` binds, in file order."""
    found: list[Diagnostic] = []
    for form in program.values:
        for node, bound in _evaluated_parts(form):
            _walk(node, bound, scope, found)
    return found


def _evaluated_parts(form: Node) -> list[tuple[Node, frozenset[str]]]:
    """The parts of a top-level form that are expressions, with the names their
    form binds around them (a `defun`'s parameters)."""
    if not isinstance(form, Seq) or form.is_vector:
        return [(form, frozenset())]
    head, items = head_name(form), form.values
    if head == "require":
        return []
    if head == "defun":
        if len(items) < 4 or not isinstance(items[2], Seq):
            return []
        return [(body, _params(items[2])) for body in items[3:]]
    if head in ("defvar", "defeval"):
        return [(item, frozenset()) for item in items[2:]]
    if head == "defrun":
        return [(item, frozenset()) for item in items[1:]]
    if head in ("defknobs", "defvariant", "defsweep"):
        entries = [e.values for e in items[1:] if isinstance(e, Seq)]
        return [(e[1], frozenset()) for e in entries if len(e) >= 2]
    return [(form, frozenset())]


def _params(node: Seq) -> frozenset[str]:
    return frozenset(str(p.value) for p in node.values if is_symbol(p))  # type: ignore[attr-defined]


def _walk(
    node: Node, bound: frozenset[str], scope: Scope, found: list[Diagnostic]
) -> None:
    if isinstance(node, Atom):
        name = node.value
        if node.kind == "symbol" and name not in bound and not scope.find(name)[0]:
            error = unbound(node, Scope(dict.fromkeys(bound), scope))
            assert isinstance(error, RunfileError)
            found.extend(error.diagnostics)
        return
    if not isinstance(node, Seq):
        return  # a comment
    items = node.values
    head = head_name(node)
    if head in TOP_LEVEL:
        return  # E-EVAL-017 when it is evaluated
    special = (
        head is not None
        and head in SPECIAL
        and head not in bound
        and not scope.find(head)[0]
    )
    if not special:
        for item in items:
            _walk(item, bound, scope, found)
        return
    if head in ("let", "fn") and (
        len(items) < 3 or not isinstance(items[1], Seq) or items[1].is_vector
    ):
        return  # malformed: E-EVAL-015 when it is evaluated
    if head == "let":
        inner = bound
        for binding in items[1].values:  # type: ignore[attr-defined]
            pair = binding.values if isinstance(binding, Seq) else ()
            if len(pair) == 2 and is_symbol(pair[0]):
                _walk(pair[1], inner, scope, found)
                inner = inner | {str(pair[0].value)}  # type: ignore[attr-defined]
        for item in items[2:]:
            _walk(item, inner, scope, found)
    elif head == "fn":
        inner = bound | _params(items[1])  # type: ignore[arg-type]
        for item in items[2:]:
            _walk(item, inner, scope, found)
    elif head == "cond":
        for clause in items[1:]:
            for item in clause.values if isinstance(clause, Seq) else ():
                _walk(item, bound, scope, found)
    else:  # if, and, or
        for item in items[1:]:
            _walk(item, bound, scope, found)
