"""`require`: the standard modules and library files a run file uses.

`(require "sexpgpu/nn" gpt cross-entropy)` binds the listed names of a standard
module; `(require "lib/common.sx" schedule)` evaluates the library file (relative
to the file that requires it, in a scope of its own) and binds the listed names of
its definitions. Only the listed names are imported; a library's `model` never
becomes the run's `model` unless the run file defines it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import stdlib_nn, stdlib_optim
from .reader import read_file
from .source import did_you_mean, fail
from .syntax import Atom, Seq, is_symbol

if TYPE_CHECKING:
    from .evaluator import Evaluator

STANDARD: dict[str, Callable[[], dict[str, Any]]] = {
    "sexpgpu/nn": stdlib_nn.exports,
    "sexpgpu/optim": stdlib_optim.exports,
}
"""The standard modules and the functions returning their exports."""


def require(ev: Evaluator, form: Seq) -> None:
    """Evaluate one `(require "module" name ...)` form into `ev`'s file scope."""
    from .evaluator import Evaluator
    from .knobs import Selection

    items = form.values
    if len(items) < 3 or not (isinstance(items[1], Atom) and items[1].kind == "str"):
        raise fail(
            "E-EVAL-015",
            "malformed (require ...)",
            form.span,
            'write (require "sexpgpu/nn" gpt cross-entropy), naming what you use',
        )
    module = str(items[1].value)
    where = items[1].span
    if module.startswith("sexpgpu/"):
        if module not in STANDARD:
            raise fail(
                "E-EVAL-008",
                f"no standard module {module!r}",
                where,
                did_you_mean(module, STANDARD)
                or "the standard modules are " + ", ".join(STANDARD),
            )
        exports = STANDARD[module]()
    else:
        if not module.endswith(".sx"):
            raise fail(
                "E-EVAL-010",
                f"require reads standard modules and .sx library files, not {module!r}",
                where,
                "there is no escape to Python: write the definitions in a .sx library",
            )
        path = os.path.join(os.path.dirname(ev.path), module)
        if os.path.abspath(path) in ev.loading:
            raise fail(
                "E-EVAL-012",
                f"{module!r} requires itself (through "
                + " -> ".join(os.path.basename(p) for p in ev.loading)
                + ")",
                where,
                "move the shared definitions into a third library",
            )
        if not os.path.isfile(path):
            raise fail(
                "E-EVAL-011",
                f"no library file {path!r}",
                where,
                "library paths are relative to the file that requires them",
            )
        library = Evaluator(path, Selection(), ev.loading).program(read_file(path))
        exports = {name: library.value(name) for name in library.defined}
    for node in items[2:]:
        if not is_symbol(node):
            raise fail(
                "E-EVAL-015",
                f"require lists names, got {node.span and 'this'}",
                node.span,
                f'(require "{module}" name ...)',
            )
        name = str(node.value)  # type: ignore[attr-defined]
        if name not in exports:
            raise fail(
                "E-EVAL-009",
                f"{module!r} exports no `{name}` (it exports "
                + " ".join(sorted(exports))
                + ")",
                node.span,
                did_you_mean(name, exports),
            )
        ev.result.scope.names[name] = exports[name]
