"""The special forms usable anywhere: `let`, `if`, `cond`, `fn`, `and`, `or`, and
the scopes names are bound in."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .source import Span, fail
from .syntax import Node, Seq, head_name, is_symbol
from .values import Closure, kind_of

if TYPE_CHECKING:
    from .evaluator import Evaluator


class Scope:
    """Names bound to values; a `let`, a call or a file opens a new one."""

    def __init__(self, names: dict[str, Any], parent: Scope | None = None) -> None:
        self.names = names
        self.parent = parent

    def find(self, name: str) -> tuple[bool, Any]:
        scope: Scope | None = self
        while scope is not None:
            if name in scope.names:
                return True, scope.names[name]
            scope = scope.parent
        return False, None

    def visible(self) -> set[str]:
        seen: set[str] = set()
        scope: Scope | None = self
        while scope is not None:
            seen |= set(scope.names)
            scope = scope.parent
        return seen


def params(node: Seq) -> tuple[str, ...]:
    names = []
    for item in node.values:
        if not is_symbol(item):
            raise fail(
                "E-EVAL-015",
                f"a parameter must be a name, got {show_node(item)}",
                item.span,
                "write (defun f (a b) ...)",
            )
        names.append(str(item.value))  # type: ignore[attr-defined]
    return tuple(names)


def show_node(node: Node) -> str:
    return getattr(node, "text", None) or ("a list" if isinstance(node, Seq) else "?")


def malformed(form: Seq, expected: str) -> Exception:
    return fail(
        "E-EVAL-015",
        f"malformed ({head_name(form)} ...)",
        form.span,
        f"write {expected}",
    )


def _let(ev: Evaluator, form: Seq, scope: Scope) -> Any:
    items = form.values
    if len(items) < 3 or not isinstance(items[1], Seq) or items[1].is_vector:
        raise malformed(form, "(let ((name value) ...) body ...)")
    local = Scope({}, scope)
    for binding in items[1].values:
        pair = binding.values if isinstance(binding, Seq) else ()
        if len(pair) != 2 or not is_symbol(pair[0]):
            raise fail(
                "E-EVAL-015",
                "a let binding is (name value)",
                binding.span,
                "write (let ((x 1) (y 2)) ...)",
            )
        local.names[str(pair[0].value)] = ev.eval(pair[1], local)  # type: ignore[attr-defined]
    result = None
    for expression in items[2:]:
        result = ev.eval(expression, local)
    return result


def _truth(value: Any, span: Span) -> bool:
    if value is None or isinstance(value, bool):
        return bool(value)
    raise fail(
        "E-EVAL-007",
        f"a condition must be true, false or nil, got {kind_of(value)}",
        span,
        "compare it: (> x 0), (= mode :train)",
    )


def _if(ev: Evaluator, form: Seq, scope: Scope) -> Any:
    items = form.values
    if len(items) not in (3, 4):
        raise malformed(form, "(if test then else)")
    if _truth(ev.eval(items[1], scope), items[1].span):
        return ev.eval(items[2], scope)
    return ev.eval(items[3], scope) if len(items) == 4 else None


def _cond(ev: Evaluator, form: Seq, scope: Scope) -> Any:
    for clause in form.values[1:]:
        parts = clause.values if isinstance(clause, Seq) else ()
        if len(parts) < 2:
            raise fail(
                "E-EVAL-015",
                "a cond clause is (test value ...)",
                clause.span,
                "write (cond ((< x 0) :neg) (true :pos))",
            )
        if _truth(ev.eval(parts[0], scope), parts[0].span):
            result = None
            for expression in parts[1:]:
                result = ev.eval(expression, scope)
            return result
    return None


def _fn(ev: Evaluator, form: Seq, scope: Scope) -> Any:
    items = form.values
    if len(items) < 3 or not isinstance(items[1], Seq) or items[1].is_vector:
        raise malformed(form, "(fn (parameters ...) body ...)")
    return Closure("fn", params(items[1]), items[2:], scope, form.span)


def _and(ev: Evaluator, form: Seq, scope: Scope) -> Any:
    result: Any = True
    for item in form.values[1:]:
        result = ev.eval(item, scope)
        if not _truth(result, item.span):
            return result
    return result


def _or(ev: Evaluator, form: Seq, scope: Scope) -> Any:
    result: Any = None
    for item in form.values[1:]:
        result = ev.eval(item, scope)
        if _truth(result, item.span):
            return result
    return result


SPECIAL = {"let": _let, "if": _if, "cond": _cond, "fn": _fn, "and": _and, "or": _or}
