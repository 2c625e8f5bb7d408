"""Knobs, variants and sweeps, and the order rules of a run file.

`(defknobs (name default "doc") ...)` declares everything a run may vary and binds
each knob as a name; `(defvariant name (knob value) ...)`, written before
`defknobs`, is a named set of overrides; `(defsweep name (knob [v ...]) ...)`,
after it, is the cross product of its knobs' values. A value replaces the default
in this order: the variant, the sweep point, then each `--set knob=value`, parsed
and typed like the default.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from .source import RunfileError, Source, Span, did_you_mean, fail
from .syntax import Atom, Node, Seq, head_name, is_symbol
from .values import Keyword, SkippedError, kind_of, show

if TYPE_CHECKING:
    from .evaluator import Evaluator

CONTRACT_ORDER = (
    "train-loader",
    "defeval",
    "prepare",
    "eval-prepare",
    "model",
    "objective",
    "evaluate",
    "optimizer",
    "curriculum",
    "defrun",
)


@dataclass(frozen=True)
class Selection:
    """The CLI's choice: a variant, a sweep point, `--set` pairs (text values)."""

    variant: str | None = None
    point: tuple[tuple[str, Any], ...] = ()
    sets: tuple[tuple[str, str], ...] = ()


@dataclass
class Knob:
    """A declared knob: its default, its doc, its value in this evaluation."""

    default: Any
    doc: str
    span: Span
    value: Any


def typed(default: Any, value: Any) -> tuple[bool, Any]:
    """(True, value as the default's type) or (False, None) when it is not one."""
    if isinstance(default, bool) or default is None:
        return (isinstance(value, type(default)), value)
    if isinstance(default, int):
        return (isinstance(value, int) and not isinstance(value, bool), value)
    if isinstance(default, float):
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return (ok, float(value) if ok else None)
    return (isinstance(value, type(default)), value)


@dataclass
class KnobTable:
    """The knobs, variants and sweeps a file declares."""

    knobs: dict[str, Knob] = field(default_factory=dict)
    variants: dict[str, list[tuple[str, Any, Span]]] = field(default_factory=dict)
    sweeps: dict[str, list[tuple[str, tuple[Any, ...]]]] = field(default_factory=dict)
    declared: bool = False
    failed: bool = False
    """The defknobs form failed (its error reported): a knob it may have
    declared is not refused again as undeclared."""

    def variant(self, form: Seq, ev: Evaluator) -> None:
        """Record `(defvariant name (knob value) ...)`; checked at `defknobs`."""
        items = form.values
        if len(items) < 2 or not is_symbol(items[1]):
            raise fail(
                "E-EVAL-015",
                "malformed (defvariant ...)",
                form.span,
                "write (defvariant small (layers 2) (width 128))",
            )
        name = str(items[1].value)  # type: ignore[attr-defined]
        if name in self.variants:
            raise fail(
                "E-KNOB-007",
                f"variant `{name}` is declared twice",
                items[1].span,
                "rename one",
            )
        self.variants[name] = [
            (knob, ev.eval(value, ev.result.scope), span)
            for knob, value, span in _pairs(items[2:], "(knob value)")
        ]

    def declare(self, form: Seq, ev: Evaluator, selection: Selection) -> None:
        """Declare the knobs, check the variants, apply the selection, bind."""
        for entry in form.values[1:]:
            parts = entry.values if isinstance(entry, Seq) else ()
            if (
                len(parts) not in (2, 3)
                or not is_symbol(parts[0])
                or (
                    len(parts) == 3
                    and not (isinstance(parts[2], Atom) and parts[2].kind == "str")
                )
            ):
                raise fail(
                    "E-KNOB-008",
                    'a knob is (name default "doc")',
                    entry.span,
                    '(lr 0.0015 "peak learning rate")',
                )
            name = str(parts[0].value)  # type: ignore[attr-defined]
            if name in self.knobs:
                raise fail(
                    "E-KNOB-006",
                    f"knob `{name}` is declared twice",
                    parts[0].span,
                    "remove one",
                )
            default = ev.eval(parts[1], ev.result.scope)
            doc = str(parts[2].value) if len(parts) == 3 else ""  # type: ignore[attr-defined]
            self.knobs[name] = Knob(default, doc, parts[0].span, default)
        self.declared = True
        for variant in self.variants.values():
            for knob, value, span in variant:
                self._set(knob, value, span, "the variant's value")
        if selection.variant is not None:
            self._check_variant(selection.variant)
            for knob, value, span in self.variants[selection.variant]:
                self.knobs[knob].value = self._set(knob, value, span, "")
        for knob, value in selection.point:
            self.knobs[knob].value = self._set(knob, value, form.span, "")
        for knob, text in selection.sets:
            self.knobs[knob].value = self.parse_setting(knob, text)
        for name, declared in self.knobs.items():
            ev.result.defined[name] = declared.span
            ev.result.scope.names[name] = declared.value

    def _set(self, knob: str, value: Any, span: Span | None, what: str) -> Any:
        if knob not in self.knobs and self.failed:
            raise SkippedError(knob)
        if knob not in self.knobs:
            raise fail(
                "E-KNOB-001",
                f"`{knob}` is not a declared knob",
                span,
                did_you_mean(knob, self.knobs) or "declare it in (defknobs ...)",
            )
        ok, converted = typed(self.knobs[knob].default, value)
        if not ok:
            default = self.knobs[knob].default
            raise fail(
                "E-KNOB-002",
                f"knob `{knob}` is {kind_of(default)} (default "
                f"{show(default)}); {what or 'the value'} {show(value)} is "
                f"{kind_of(value)}",
                span,
                f"give `{knob}` {kind_of(default)}",
            )
        return converted

    def _check_variant(self, name: str) -> None:
        if name not in self.variants:
            known = " ".join(self.variants) or "none"
            raise fail(
                "E-KNOB-004",
                f"no variant `{name}` (the file declares {known})",
                command_line("--variant", name),
                did_you_mean(name, self.variants)
                or (
                    "declare it: (defvariant NAME (knob value) ...) before defknobs"
                    if not self.variants
                    else f"use one of: {known}"
                ),
            )

    def parse_setting(self, knob: str, text: str) -> Any:
        """`--set knob=text`: the text read and typed like the knob's default.

        Raises:
            RunfileError: E-KNOB-003 for an unknown knob (pointing at its name on
                the command line, with the nearest), E-KNOB-002 for text that is
                not of the default's type (pointing at the text, with a value of
                the right type to write).
        """
        from .reader import read_text

        if knob not in self.knobs and self.failed:
            raise SkippedError(knob)
        where = command_line("--set", f"{knob}={text}")
        if knob not in self.knobs:
            raise fail(
                "E-KNOB-003",
                f"--set {knob}={text}: no knob `{knob}` (the "
                f"knobs are {' '.join(self.knobs) or 'none'})",
                replace(where, length=len(knob)),
                did_you_mean(knob, self.knobs)
                or 'declare it in (defknobs (NAME default "doc") ...)',
            )
        default = self.knobs[knob].default
        if isinstance(default, str):
            return text
        value_at = replace(where, col=where.col + len(knob) + 1, length=len(text))
        try:
            forms = read_text(text, f"--set {knob}").values
        except RunfileError as error:  # unreadable text: say why, as a wrong value
            raise fail(
                "E-KNOB-002",
                f"--set {knob}={text}: {error.diagnostics[0].message}",
                value_at,
                setting_fix(knob, default, None),
            ) from None
        value = _literal(forms[0]) if len(forms) == 1 else _Unreadable(text)
        ok, converted = typed(default, value)
        if not ok:
            raise fail(
                "E-KNOB-002",
                f"--set {knob}={text}: knob `{knob}` is "
                f"{kind_of(default)} (default {show(default)}), and {text!r} "
                f"is {_kind(value)}",
                value_at,
                setting_fix(knob, default, value),
            )
        return converted

    def sweep(self, form: Seq, ev: Evaluator) -> None:
        """Record `(defsweep name (knob [values]) ...)` after checking its knobs."""
        items = form.values
        if len(items) < 3 or not is_symbol(items[1]):
            raise fail(
                "E-EVAL-015",
                "malformed (defsweep ...)",
                form.span,
                "write (defsweep seeds (seed [1 2 3]))",
            )
        axes = []
        for knob, values, span in _pairs(items[2:], "(knob [values ...])"):
            values = ev.eval(values, ev.result.scope)
            if not isinstance(values, tuple) or not values:
                raise fail(
                    "E-KNOB-005",
                    f"sweep values of `{knob}` must be a "
                    f"non-empty vector, got {show(values)}",
                    span,
                )
            axes.append(
                (knob, tuple(self._set(knob, v, span, "a swept value") for v in values))
            )
        self.sweeps[str(items[1].value)] = axes  # type: ignore[attr-defined]

    def points(self, name: str) -> list[tuple[tuple[str, Any], ...]]:
        """The sweep `name`'s points: the cross product of its knobs' values."""
        if name not in self.sweeps:
            raise fail(
                "E-KNOB-005",
                f"no sweep `{name}` (the file declares "
                f"{' '.join(self.sweeps) or 'none'})",
                command_line("--sweep", name),
                did_you_mean(name, self.sweeps),
            )
        axes = self.sweeps[name]
        return [
            tuple(zip([k for k, _ in axes], combo, strict=True))
            for combo in itertools.product(*(v for _, v in axes))
        ]

    def finish(self, selection: Selection, span: Span | None) -> None:
        """Refuse a selection the file cannot honour (no defknobs at all)."""
        if self.declared or self.failed:
            return
        if selection.variant is not None:
            self._check_variant(selection.variant)
        if selection.sets:
            knob, text = selection.sets[0]
            self.parse_setting(knob, text)


def command_line(flag: str, value: str) -> Span:
    """Where `flag value` was given on the command line: the value's span on a
    one-line source named `command line`, so a diagnostic underlines it."""
    return Span(Source("command line", f"{flag} {value}"), 1, len(flag) + 2, len(value))


def setting_fix(knob: str, default: Any, value: Any) -> str:
    """What to write instead of a `--set` value of the wrong type: a value of the
    default's type, near the one given when there is one (`--set dim=2.5` for an
    integer knob: `--set dim=2` or `--set dim=3`)."""
    wanted = kind_of(default)
    if isinstance(default, bool):
        return (
            f"`{knob}` takes true or false: write --set {knob}=true or "
            f"--set {knob}=false"
        )
    if isinstance(default, int) and isinstance(value, float):
        low, high = math.floor(value), math.ceil(value)
        return (
            f"`{knob}` takes {wanted}: write --set {knob}={low} or --set {knob}={high} "
            f"(its default is {show(default)})"
        )
    if isinstance(default, Keyword) and isinstance(value, _Unreadable):
        return (
            f"`{knob}` takes a keyword, which starts with `:`: write --set "
            f"{knob}=:{value} (its default is {show(default)})"
        )
    return (
        f"`{knob}` takes {wanted}, such as its default: write "
        f"--set {knob}={show(default)}"
    )


def _kind(value: Any) -> str:
    return "not a value" if isinstance(value, _Unreadable) else kind_of(value)


class _Unreadable:
    def __init__(self, text: str) -> None:
        self.text = text

    def __str__(self) -> str:
        return self.text


def _literal(node: Node) -> Any:
    if isinstance(node, Atom):
        return (
            Keyword(node.value)
            if node.kind == "keyword"
            else (node.value if node.kind != "symbol" else _Unreadable(node.text))
        )
    assert isinstance(node, Seq)
    return tuple(_literal(i) for i in node.values)


def _pairs(entries: tuple[Node, ...], shape: str) -> list[tuple[str, Node, Span]]:
    pairs = []
    for entry in entries:
        parts = entry.values if isinstance(entry, Seq) else ()
        if len(parts) != 2 or not is_symbol(parts[0]):
            raise fail("E-EVAL-015", f"expected {shape}", entry.span, f"write {shape}")
        pairs.append((str(parts[0].value), parts[1], parts[0].span))  # type: ignore[attr-defined]
    return pairs


class OrderCheck:
    """The order rules of a file (`spec/runfile.txt`, "The order of a file")."""

    def __init__(self) -> None:
        self.other_seen = False
        self.knobs_span: Span | None = None
        self.contract: list[tuple[int, str, Span]] = []

    def see(self, form: Node) -> None:
        """Check `form` against the forms before it (E-ORDER-*)."""
        head = head_name(form)
        span = form.span
        if head == "require":
            if self.other_seen:
                raise fail(
                    "E-ORDER-001",
                    "(require ...) after other forms",
                    span,
                    "move every require to the top of the file",
                )
            return
        self.other_seen = True
        if head == "defvariant" and self.knobs_span is not None:
            raise fail(
                "E-ORDER-002",
                f"(defvariant ...) after (defknobs ...) at line {self.knobs_span.line}",
                span,
                "move it before defknobs",
            )
        if head == "defsweep" and self.knobs_span is None:
            raise fail(
                "E-ORDER-003",
                "(defsweep ...) before (defknobs ...)",
                span,
                "move it after defknobs: a sweep ranges over declared knobs",
            )
        if head == "defknobs":
            if self.knobs_span is not None:
                raise fail(
                    "E-KNOB-006",
                    "a second (defknobs ...)",
                    span,
                    "declare every knob in one defknobs",
                )
            self.knobs_span = span
        if head in ("defvariant", "defknobs", "defsweep") and self.contract:
            raise fail(
                "E-ORDER-005",
                f"({head} ...) after `{self.contract[-1][1]}`",
                span,
                "knobs, variants and sweeps come before the contract's names",
            )
        name = _contract_name(form, head)
        if name is None:
            return
        rank = CONTRACT_ORDER.index(name)
        later = [(r, n, s) for r, n, s in self.contract if r > rank]
        if later:
            _, other, where = later[0]
            # Forget the name out of place, so the names after it are not all
            # reported against it again.
            self.contract = [c for c in self.contract if c[0] <= rank]
            self.contract.append((rank, name, span))
            raise fail(
                "E-ORDER-004",
                f"`{name}` comes after `{other}` (line {where.line})",
                span,
                f"the order is {' '.join(CONTRACT_ORDER)}",
            )
        self.contract.append((rank, name, span))


def _contract_name(form: Node, head: str | None) -> str | None:
    if head in ("defeval", "defrun"):
        return head
    if head in ("defvar", "defun") and isinstance(form, Seq) and len(form.values) > 1:
        name = getattr(form.values[1], "value", None)
        return name if name in CONTRACT_ORDER else None
    return None
