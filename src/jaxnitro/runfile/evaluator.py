"""The evaluator: a run file's forms, evaluated once, in order.

Special forms: `require`, `defvar`, `defun`, `defknobs`, `defvariant`, `defsweep`,
`defeval`, `defrun` (top level only), and `let`, `if`, `cond`, `fn`, `and`, `or`
anywhere. Everything else is a call. There is no escape to Python: no form imports,
opens, executes or reads anything; a run file reaches data only through the paths
its loader declares, and other files only by `require` of `.sx` libraries.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from . import core, knobs
from .reader import read_file
from .source import CallSpan, Diagnostic, RunfileError, Span, did_you_mean, fail
from .special import SPECIAL, Scope, malformed, params, show_node
from .syntax import Atom, Node, Program, Seq, head_name, is_symbol
from .values import (
    POISONED,
    Builtin,
    Closure,
    Keyword,
    Poisoned,
    SkippedError,
    kind_of,
    show,
)

MAX_DEPTH = 200
ORDER_ONLY = {"E-ORDER-001", "E-ORDER-002", "E-ORDER-004", "E-ORDER-005"}
"""The order errors after which a form is still evaluated (collecting): its
place is wrong but its value is not; a sweep before defknobs or a second defknobs
is not evaluated."""
ESCAPES = (
    "import",
    "open",
    "exec",
    "eval",
    "__import__",
    "system",
    "getattr",
    "python",
    "py",
    "load",
    "read",
    "subprocess",
    "shell",
    "os",
)
TOP_LEVEL = (
    "require",
    "defvar",
    "defun",
    "defknobs",
    "defvariant",
    "defsweep",
    "defeval",
    "defrun",
)


@dataclass
class Evaluated:
    """What a run file defined: its bindings, where each was defined, its run."""

    path: str
    scope: Scope
    defined: dict[str, Span] = field(default_factory=dict)
    run: Any = None
    run_span: Span | None = None
    evals: list[tuple[str, Any, Span]] = field(default_factory=list)
    knobs: knobs.KnobTable = field(default_factory=lambda: knobs.KnobTable())
    errors: list[Diagnostic] = field(default_factory=list)
    """The diagnostics of the forms that failed (an evaluator that collects)."""

    def usable(self, name: str) -> bool:
        """Whether the top-level `name` is defined and its definition worked."""
        return name in self.defined and not isinstance(
            self.scope.names.get(name), Poisoned
        )

    def value(self, name: str) -> Any:
        """The value a top-level name of this file is bound to."""
        return self.scope.names[name]


def evaluate_file(path: str, selection: knobs.Selection | None = None) -> Evaluated:
    """Read and evaluate the run file at `path` (knob selection from the CLI)."""
    return Evaluator(path, selection or knobs.Selection(), ()).program(read_file(path))


class Evaluator:
    """Evaluates one file; a `require`d library gets an evaluator of its own."""

    def __init__(
        self,
        path: str,
        selection: knobs.Selection,
        loading: tuple[str, ...],
        *,
        collect: bool = False,
    ) -> None:
        self.path = path
        self.selection = selection
        self.loading = (*loading, os.path.abspath(path))
        self.depth = 0
        self.collect = collect
        self.result = Evaluated(path, Scope({}, Scope(core.core_names())))

    def program(self, program: Program) -> Evaluated:
        """Evaluate every top-level form in order, checking the file's order.

        Raises:
            RunfileError: the first form's error; with `collect`, none: each
                failed form's diagnostics go to `Evaluated.errors`, the names it
                defines are poisoned (`values.Poisoned`) and the next form is
                evaluated, so `check` reports every error it can find.
        """
        order = knobs.OrderCheck()
        for form in program.values:
            try:
                order.see(form)
            except RunfileError as error:
                if not self.collect:
                    raise
                self.result.errors.extend(error.diagnostics)
                if not set(error.codes) <= ORDER_ONLY:
                    self.poison(form)
                    continue
            try:
                self.form(form)
            except RunfileError as error:
                if not self.collect:
                    raise
                self.result.errors.extend(error.diagnostics)
                self.poison(form)
            except SkippedError:  # a use of a poisoned name: already reported
                self.poison(form)
        try:
            self.result.knobs.finish(self.selection, order.knobs_span)
        except RunfileError as error:
            if not self.collect:
                raise
            self.result.errors.extend(error.diagnostics)
        except SkippedError:
            pass  # a --set of a knob the failed defknobs may declare
        return self.result

    def form(self, form: Node) -> None:
        """Evaluate one top-level form."""
        name = head_name(form)
        try:
            if name in TOP_LEVEL:
                assert isinstance(form, Seq)
                self.top_level(name, form)
            else:
                self.eval(form, self.result.scope)
        except RecursionError:
            raise too_deep(form.span, "this form") from None

    def poison(self, form: Node) -> None:
        """Bind the names a failed top-level form would define to `POISONED`
        (those not defined already), so their uses are not reported again."""
        for node in defined_names(form):
            name = str(node.value)  # type: ignore[attr-defined]
            if name not in self.result.defined:
                self.result.defined[name] = node.span
                self.result.scope.names[name] = POISONED
        if head_name(form) == "defknobs":
            self.result.knobs.failed = True
        if head_name(form) == "defrun" and self.result.run is None:
            self.result.run = POISONED
            self.result.run_span = form.span

    # top-level forms

    def top_level(self, name: str, form: Seq) -> None:
        """Evaluate one top-level definition form `(name ...)`."""
        {
            "require": self.top_require,
            "defvar": self.top_defvar,
            "defun": self.top_defun,
            "defknobs": self.top_defknobs,
            "defvariant": self.top_defvariant,
            "defsweep": self.top_defsweep,
            "defeval": self.top_defeval,
            "defrun": self.top_defrun,
        }[name](form)

    def bind(self, name_node: Node, value: Any, what: str) -> None:
        if not is_symbol(name_node):
            raise fail(
                "E-EVAL-015",
                f"{what} needs a name, got {show_node(name_node)}",
                name_node.span,
                f"write ({what} name ...)",
            )
        name = str(name_node.value)  # type: ignore[attr-defined]
        if name in self.result.defined:
            first = self.result.defined[name]
            raise fail(
                "E-EVAL-016",
                f"`{name}` is already defined at line {first.line}",
                name_node.span,
                "a run file defines each name once: rename one",
            )
        self.result.defined[name] = name_node.span
        self.result.scope.names[name] = value

    def top_require(self, form: Seq) -> None:
        from .modules import require

        require(self, form)

    def top_defvar(self, form: Seq) -> None:
        items = form.values
        if len(items) != 3:
            raise malformed(form, "(defvar name value)")
        self.bind(items[1], self.eval(items[2], self.result.scope), "defvar")

    def top_defun(self, form: Seq) -> None:
        items = form.values
        if len(items) < 4 or not isinstance(items[2], Seq) or items[2].is_vector:
            raise malformed(form, "(defun name (parameters ...) body ...)")
        name = str(getattr(items[1], "value", "?"))
        closure = Closure(
            name, params(items[2]), items[3:], self.result.scope, form.span
        )
        self.bind(items[1], closure, "defun")

    def top_defknobs(self, form: Seq) -> None:
        self.result.knobs.declare(form, self, self.selection)

    def top_defvariant(self, form: Seq) -> None:
        self.result.knobs.variant(form, self)

    def top_defsweep(self, form: Seq) -> None:
        self.result.knobs.sweep(form, self)

    def top_defeval(self, form: Seq) -> None:
        from .stdlib_data import eval_pass

        items = form.values
        if len(items) < 2 or not is_symbol(items[1]):
            raise malformed(form, "(defeval name :loader (loader ...) :every N)")
        spec = self.call_builtin(eval_pass, items[2:], self.result.scope, form.span)
        self.result.evals.append((str(items[1].value), spec, form.span))  # type: ignore[attr-defined]

    def top_defrun(self, form: Seq) -> None:
        from .stdlib_data import defrun

        if self.result.run is not None:
            raise fail(
                "E-EVAL-016",
                "a second (defrun ...)",
                form.span,
                "a run file has one defrun: merge them",
            )
        self.result.run = self.call_builtin(
            defrun, form.values[1:], self.result.scope, form.span
        )
        self.result.run_span = form.span

    # expressions

    def eval(self, node: Node, scope: Scope) -> Any:
        """The value of one expression."""
        if isinstance(node, Atom):
            if node.kind == "keyword":
                return Keyword(node.value)
            if node.kind != "symbol":
                return node.value
            found, value = scope.find(node.value)
            if found:
                if value is POISONED:
                    raise SkippedError(node.value)
                return value
            raise unbound(node, scope)
        assert isinstance(node, Seq)
        if node.is_vector:
            return tuple(self.eval(item, scope) for item in node.values)
        items = node.values
        if not items:
            raise fail(
                "E-EVAL-015",
                "an empty list `()` is not an expression",
                node.span,
                "write nil, or (list) for an empty list",
            )
        name = head_name(node)
        if name in TOP_LEVEL:
            raise fail(
                "E-EVAL-017",
                f"({name} ...) is allowed only at the top level",
                node.span,
                f"move the ({name} ...) out to the top of the file",
            )
        special = SPECIAL.get(name or "")
        if special is not None and not scope.find(name or "")[0]:
            return special(self, node, scope)
        function = self.eval(items[0], scope)
        return self.apply(function, items[1:], scope, node.span)

    def apply(
        self, function: Any, args: tuple[Node, ...], scope: Scope, span: Span
    ) -> Any:
        """Call `function` on the argument expressions `args`."""
        if isinstance(function, Builtin):
            return self.call_builtin(function, args, scope, span)
        if not isinstance(function, Closure):
            raise fail(
                "E-EVAL-003",
                f"{kind_of(function)} ({show(function)}) is not a function",
                span,
                "the first item of a list is the function "
                "to call; use a vector [ ... ] for data",
            )
        values = [self.eval(a, scope) for a in args]
        return self.call(function, values, span)

    def call(self, function: Any, values: list[Any], span: Span) -> Any:
        """Call an evaluated function on evaluated positional values."""
        if isinstance(function, Builtin):
            return core.invoke(function, values, {}, span)
        if len(values) != len(function.params):
            raise fail(
                "E-EVAL-004",
                f"`{function.name}` takes {len(function.params)} "
                f"argument(s) ({' '.join(function.params)}), got {len(values)}",
                span,
            )
        if self.depth >= MAX_DEPTH:
            raise fail(
                "E-EVAL-013",
                f"calls nested deeper than {MAX_DEPTH} (in `{function.name}`)",
                span,
                "a recursion without an end?",
            )
        local = Scope(dict(zip(function.params, values, strict=True)), function.env)
        outermost = self.depth == 0
        self.depth += 1
        try:
            result = None
            for expression in function.body:
                result = self.eval(expression, local)
            return result
        except RecursionError:
            # Python's stack ran out before MAX_DEPTH calls (each call nests
            # several frames per let, if or argument): report it where the
            # outermost call was made, where the stack has room again.
            if not outermost:
                raise
            raise too_deep(span, f"`{function.name}`") from None
        finally:
            self.depth -= 1

    def call_builtin(
        self, function: Builtin, args: tuple[Node, ...], scope: Scope, span: Span
    ) -> Any:
        positional, pairs = split_arguments(args, function.keywords is None)
        values = [self.eval(a, scope) for a in positional]
        places: dict[str | int, Span] = {i: a.span for i, a in enumerate(positional)}
        kwargs: dict[str, Any] = {}
        for key, value in pairs:
            name = str(key.value)  # type: ignore[attr-defined]
            core.check_keyword(function, name, kwargs, key.span)
            kwargs[name] = self.eval(value, scope)
            places[name] = value.span
        site = CallSpan(span.source, span.line, span.col, span.length, places)
        return core.invoke(function, values, kwargs, site)


def split_arguments(
    args: tuple[Node, ...], raw: bool
) -> tuple[tuple[Node, ...], list[tuple[Node, Node]]]:
    """Positional arguments and `:key value` pairs, the pairs read from the end."""
    if raw:
        return args, []
    end = len(args)
    while end >= 2 and _is_keyword(args[end - 2]):
        end -= 2
    pairs = [(args[i], args[i + 1]) for i in range(end, len(args), 2)]
    return args[:end], pairs


def _is_keyword(node: Node) -> bool:
    return isinstance(node, Atom) and node.kind == "keyword"


def defined_names(form: Node) -> list[Node]:
    """The name nodes a top-level form defines: `defvar` and `defun` their name,
    `defknobs` each knob, `require` each name it lists."""
    if not isinstance(form, Seq):
        return []
    head, items = head_name(form), form.values
    if head in ("defvar", "defun") and len(items) > 1 and is_symbol(items[1]):
        return [items[1]]
    if head == "require":
        return [n for n in items[2:] if is_symbol(n)]
    if head == "defknobs":
        entries = [e.values for e in items[1:] if isinstance(e, Seq)]
        return [e[0] for e in entries if e and is_symbol(e[0])]
    return []


def too_deep(span: Span, where: str) -> Exception:
    """E-EVAL-013 for an evaluation that ran out of Python's stack in `where`."""
    return fail(
        "E-EVAL-013",
        f"calls nested too deeply (in {where}): the evaluation ran out of stack "
        f"before {MAX_DEPTH} calls",
        span,
        "a recursion without an end? Otherwise nest fewer calls in one another",
    )


def unbound(node: Atom, scope: Scope) -> Exception:
    name = str(node.value)
    if name in ESCAPES or name.startswith("__"):
        return fail(
            "E-EVAL-002",
            f"`{name}`: there is no escape to Python in a run file",
            node.span,
            "a run file reaches data only through the "
            "(files [...]) of its loaders, and code only through (require ...)",
        )
    return fail(
        "E-EVAL-001",
        f"`{name}` is not defined",
        node.span,
        did_you_mean(name, scope.visible() | set(SPECIAL))
        or "define it with (defvar ...) or (defun ...), or (require ...) it",
    )
