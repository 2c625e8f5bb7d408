"""A `MetricHistory` fitted to a terminal: which rows, which columns, what was left out.

`history_table(h, height, width)` computes everything a renderer draws, without
drawing: rows thinned by `thin_rows` to windows around the first, the best and the last
epoch, columns after epoch, step, train_loss and the selection metric dropped from the
right until the table fits, and a note saying what is not shown and how to select it.
`render_text` draws it as plain text (`repr(h)`); `render_rich` as a rich Table
(`rich.print(h)`, which passes the console's size).

Row numbers here are 0-based positions in the history, and a gap is None: a gap can
never be used as an index by mistake (the spec's 1-based rows mark a gap with 0).
"""

from __future__ import annotations

import numbers
import textwrap
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from .history import LEADING
from .number_format import format_number, format_seconds

if TYPE_CHECKING:
    from rich.table import Table

    from .history import MetricHistory

CHROME_LINES = 6
"""Lines of a rendered table that are not data rows: the title, the top border, the
header, the header rule, the bottom border and the note."""
GAP = "⋮"
"""The cell text of a gap row."""

BAD_THIN = (
    "thin_rows({name}={value!r}): {constraint}. It takes the row count n >= 0, the "
    "best row's 0-based position in range(n) or None, and the line budget >= 0."
)


def _lines(windows: list[tuple[int, int]]) -> int:
    shown = sorted({i for lo, hi in windows for i in range(lo, hi + 1)})
    gaps = sum(1 for a, b in zip(shown, shown[1:], strict=False) if b - a > 1)
    return len(shown) + gaps


def thin_rows(n: int, best: int | None, budget: int) -> list[int | None]:
    """Which of `n` rows to show in `budget` lines, None marking a gap line.

    Windows around the first, the best (or None) and the last row grow one row at a
    time, round-robin (first, before best, after best, last), while the lines used,
    rows plus one line per gap, stay within `budget`. The best window grows in both
    directions, so it gets twice the context of the ends. Rows are 0-based positions.
    With a budget too small for every window, the best comes first, then the last,
    then the first.

    Examples:
        >>> thin_rows(30, 14, 10)
        [0, 1, 2, None, 13, 14, 15, None, 28, 29]
        >>> thin_rows(4, None, 10)
        [0, 1, 2, 3]
    """
    checks = (
        ("n", n, isinstance(n, numbers.Integral) and n >= 0, "n must be >= 0"),
        (
            "budget",
            budget,
            isinstance(budget, numbers.Integral) and budget >= 0,
            "budget must be >= 0",
        ),
        (
            "best",
            best,
            best is None or (isinstance(best, numbers.Integral) and 0 <= best < n),
            f"best must be None or in range({n})",
        ),
    )
    for name, value, ok, constraint in checks:
        if not ok:
            raise ConfigError(
                BAD_THIN.format(name=name, value=value, constraint=constraint)
            )
    if n <= budget:
        return list(range(n))
    windows: dict[str, tuple[int, int]] = {}
    seeds = (("best", best), ("last", n - 1), ("first", 0))
    for name, row in seeds:
        if row is not None and _lines([*windows.values(), (row, row)]) <= budget:
            windows[name] = (row, row)
    growers = (("first", 0, 1), ("best", -1, 0), ("best", 0, 1), ("last", -1, 0))
    grew = True
    while grew:
        grew = False
        for name, down, up in growers:
            if name not in windows:
                continue
            lo, hi = windows[name]
            trial = (lo + down, hi + up)
            if trial == (lo, hi) or trial[0] < 0 or trial[1] >= n:
                continue
            if _lines([*(w for k, w in windows.items() if k != name), trial]) <= budget:
                windows[name] = trial
                grew = True
    shown = sorted({i for lo, hi in windows.values() for i in range(lo, hi + 1)})
    out: list[int | None] = []
    for i, row in enumerate(shown):
        if i and row - shown[i - 1] > 1:
            out.append(None)
        out.append(row)
    return out


def format_cell(value: Any, column: str = "") -> str:
    """A cell's text: `format_number`'s rule, None empty, the `seconds` column's
    durations to a tenth (`format_seconds`).

    Examples:
        >>> [format_cell(v) for v in (12, 0.041683124, None, float("nan"), 1e-7)]
        ['12', '0.04168', '', 'nan', '1e-07']
        >>> format_cell(0.19469, "seconds")
        '0.2'
    """
    if value is None:
        return ""
    if column == "seconds" and isinstance(value, float):
        return format_seconds(value)
    return format_number(value)


def table_width(widths: list[int]) -> int:
    """Terminal columns a boxed table of these column widths takes (rich's layout)."""
    return sum(widths) + 3 * len(widths) + 1


def history_table(h: MetricHistory, height: int, width: int) -> dict[str, Any]:
    """Everything a renderer needs to draw `h` in a `height` x `width` terminal.

    Returns:
        A dict with `title` (str), `labels` (column names shown), `cells` (one list of
        strings per shown line; a gap line holds GAP in every cell), `alignment`
        ("right" per column), `best_row` (index into `cells` of the best epoch, or
        None), `gap_rows` (indices into `cells` of gap lines) and `note` (what is not
        shown and how to select it; "" when everything is).

    Examples:
        >>> from jaxnitro.observe.history import MetricHistory
        >>> h = MetricHistory(
        ...     [{"epoch": e, "step": e, "train_loss": 1.0,
        ...       "acc": 1 - abs(e - 20) / 40, "recall": 0.5} for e in range(1, 41)],
        ...     selection_metric=("acc", "max"),
        ... )
        >>> t = history_table(h, 20, 44)
        >>> t["labels"], len(t["cells"]), t["best_row"], t["gap_rows"]
        (['epoch', 'step', 'train_loss', 'acc'], 10, 5, [3, 7])
        >>> print(t["note"])
        Showing 8 of 40 epochs; h[a:b] selects epochs a..b. Not shown for width:
        recall; select with h['recall'].
    """
    rows = list(h)
    best = h._positions.get(h.best_epoch) if h.best_epoch is not None else None
    title = history_title(h)
    budget = max(height - CHROME_LINES, 1)
    for _ in range(8):  # shrink until the wrapped title and note fit too
        picked = thin_rows(len(rows), best, budget)
        labels, dropped, used = _fit_columns(h, rows, picked, width)
        note = _note(h, sum(i is not None for i in picked), dropped)
        wrap = max(used - 2, 8)  # rich wraps the title and note to the table
        over = (
            len(picked)
            + CHROME_LINES
            - 2
            + _wrapped_lines(title, wrap)
            + _wrapped_lines(note, wrap)
            - height
        )
        if over <= 0 or budget == 1:
            break
        budget = max(budget - over, 1)
    cells = [
        [GAP] * len(labels)
        if i is None
        else [format_cell(rows[i][c], c) for c in labels]
        for i in picked
    ]
    return {
        "title": title,
        "labels": labels,
        "cells": cells,
        "alignment": ["right"] * len(labels),
        "best_row": picked.index(best) if best is not None and best in picked else None,
        "gap_rows": [k for k, i in enumerate(picked) if i is None],
        "note": note,
    }


def _wrapped_lines(text: str, width: int) -> int:
    return len(textwrap.wrap(text, width)) if text else 0


def _fit_columns(
    h: MetricHistory, rows: list[dict[str, Any]], picked: list[int | None], width: int
) -> tuple[list[str], list[str], int]:
    """The columns shown, those dropped for width, and the table's width."""
    columns = list(h.columns)
    fixed = [c for c in columns if c in _fixed_names(h)]
    optional = [c for c in columns if c not in fixed]
    widths = {
        c: max(
            [len(c), len(GAP)]
            + [len(format_cell(rows[i][c], c)) for i in picked if i is not None]
        )
        for c in columns
    }
    dropped: list[str] = []
    while optional and table_width([widths[c] for c in fixed + optional]) > width:
        dropped.insert(0, optional.pop())
    labels = fixed + optional
    return labels, dropped, table_width([widths[c] for c in labels])


def _fixed_names(h: MetricHistory) -> tuple[str, ...]:
    chosen = h.selection_metric[0] if h.selection_metric else None
    return LEADING + ((chosen,) if chosen else ())


def history_title(h: MetricHistory) -> str:
    """The one-line title of a table or plot of `h`."""
    epochs = h.epoch if len(h) else []
    if not epochs:
        return "MetricHistory: no epochs"
    title = f"MetricHistory: epochs {epochs[0]}..{epochs[-1]} ({len(epochs)} rows)"
    if h.best_epoch is not None and h.selection_metric is not None:
        name, mode = h.selection_metric
        title += f", best epoch {h.best_epoch} by {name} ({mode})"
    return title


def _accessor(name: str) -> str:
    return f"h.{name}" if name.isidentifier() else f"h.column({name!r})"


def _note(h: MetricHistory, shown: int, dropped: list[str]) -> str:
    parts = []
    resumed = h.resumed_from_epoch
    if resumed:
        parts.append(
            f"Epochs 1..{resumed} were trained before this handle resumed, so its "
            f"history starts at epoch {resumed + 1}."
        )
    if shown < len(h):
        parts.append(f"Showing {shown} of {len(h)} epochs; h[a:b] selects epochs a..b.")
    if dropped:
        names = ", ".join(dropped)
        select = ", ".join(repr(c) for c in dropped)
        parts.append(f"Not shown for width: {names}; select with h[{select}].")
    if h.non_scalar:
        names = ", ".join(h.non_scalar)
        reads = ", ".join(_accessor(c) for c in h.non_scalar)
        parts.append(f"Non-scalar metrics (not columns): {names}; read {reads}.")
    return " ".join(parts)


def render_text(table: dict[str, Any]) -> str:
    """Plain text: the title, a header, the rows (`*` marks the best), the note."""
    labels = table["labels"]
    widths = [
        max([len(label), *(len(row[k]) for row in table["cells"])])
        for k, label in enumerate(labels)
    ]

    def line(marker: str, values: list[str]) -> str:
        cells = (v.rjust(w) for v, w in zip(values, widths, strict=True))
        return (marker + "  ".join(cells)).rstrip()

    out = [table["title"]]
    if table["cells"]:
        out.append(line("  ", labels))
        out.append(line("  ", ["-" * w for w in widths]))
        for k, row in enumerate(table["cells"]):
            out.append(line("* " if k == table["best_row"] else "  ", row))
    if table["note"]:
        out.append(table["note"])
    return "\n".join(out)


def render_rich(table: dict[str, Any]) -> Table:
    """A `rich.table.Table`: the best row bold green, gap rows dim, the note below."""
    from rich.table import Table
    from rich.text import Text

    rich_table = Table(
        title=Text(table["title"]),
        caption=Text(table["note"]) if table["note"] else None,
        caption_justify="left",
    )
    for label, justify in zip(table["labels"], table["alignment"], strict=True):
        rich_table.add_column(Text(label), justify=justify, no_wrap=True)
    gaps = set(table["gap_rows"])
    for k, row in enumerate(table["cells"]):
        style = (
            "bold green" if k == table["best_row"] else ("dim" if k in gaps else None)
        )
        rich_table.add_row(*(Text(cell) for cell in row), style=style)
    return rich_table
