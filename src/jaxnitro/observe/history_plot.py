"""Plots of a `MetricHistory`: the series to draw, and a matplotlib figure of them.

`history_series` computes everything a plot draws without a plotting package, so
another front end (a notebook widget, a web page) can draw the same thing. `plot`
draws it with matplotlib, an optional extra (`pip install 'jaxnitro[plot]'`): every
logged metric by default, one panel each on whole-number epoch ticks, the
checkpointer's chosen epoch marked with a star on each. Without a path the figure is
pyplot's current one (so `plt.savefig` saves it); with a path it is saved and never
enters pyplot's global state.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..extras import require
from .history_text import format_cell, history_title

if TYPE_CHECKING:
    from .history import MetricHistory

NOT_AXIS = "history_series x must be 'epoch' or 'step'; got {value!r}."
NOT_SERIES = (
    "history_series cannot draw `{name}`: {why}. Scalar columns: {columns}. Pass "
    "metrics=None (the checkpointer's metric, else every metric), 'all', one name, "
    "or a list of names."
)
NOTHING_TO_PLOT = (
    "plot(h) has nothing to draw: the history holds {n} epochs and no scalar "
    "metric{extra}. Train at least one epoch first, or pass metrics= naming a column."
)
BOOKKEEPING = ("epoch", "step", "seconds")
"""Columns that are axes or bookkeeping, never a default panel."""


def _names(h: MetricHistory, metrics: str | Iterable[str] | None) -> list[str]:
    columns = list(h.columns)
    metric_names = [c for c in columns if c not in (*BOOKKEEPING, "train_loss")]
    if metrics is None:
        chosen = h.selection_metric[0] if h.selection_metric else None
        if chosen in columns:
            return [str(chosen)]
        if metric_names:
            return metric_names
        return ["train_loss"] if "train_loss" in columns else []
    if metrics == "all":
        return [c for c in columns if c not in BOOKKEEPING]
    names = [metrics] if isinstance(metrics, str) else list(metrics)
    for name in names:
        if name in columns:
            continue
        why = (
            "it is not a scalar column (a non-scalar metric has no line to draw)"
            if name in h.non_scalar
            else "the history has no such column"
        )
        raise ConfigError(
            NOT_SERIES.format(name=name, why=why, columns=", ".join(columns) or "none")
        )
    return names


def _subtitle(
    h: MetricHistory,
    name: str,
    xs: list[Any],
    ys: list[Any],
    best: tuple[Any, Any] | None,
    x: str,
) -> str:
    if best is not None and h.selection_metric and name == h.selection_metric[0]:
        mode = h.selection_metric[1]
        return f"{name}: best {format_cell(best[1])} at {x} {best[0]} ({mode})"
    if best is not None:
        return f"{name}: {format_cell(best[1])} at the best epoch ({h.best_epoch})"
    if ys:
        return f"{name}: last {format_cell(ys[-1])} at {x} {xs[-1]}"
    return f"{name}: no values"


def history_series(
    h: MetricHistory,
    *,
    x: str = "epoch",
    metrics: str | Iterable[str] | None = None,
) -> dict[str, Any]:
    """Everything a plot of `h` draws, computed without a plotting package.

    Args:
        h: the history.
        x: "epoch" or "step", the horizontal axis.
        metrics: None (the checkpointer's metric if the history has it, else every
            scalar metric but train_loss, else train_loss), "all" (every scalar
            column including train_loss; not epoch, step or seconds), one name, or a
            list of names.

    Returns:
        A dict with `title`, `xlabel` and `panels`, one per metric, each a dict with
        `name`, `x` and `y` (lists), `best` (the `(x, y)` point of the checkpointer's
        chosen epoch on that panel, else None) and `subtitle`. A row lacking the
        metric is skipped; a non-finite value is kept, so the line breaks there.

    Examples:
        >>> from jaxnitro.observe.history import MetricHistory
        >>> h = MetricHistory(
        ...     [{"epoch": e, "step": 5 * e, "train_loss": 1.0, "acc": a}
        ...      for e, a in ((1, 0.5), (2, 0.8), (3, 0.7))],
        ...     selection_metric=("acc", "max"),
        ... )
        >>> panel = history_series(h, x="step")["panels"][0]
        >>> panel["x"], panel["y"], panel["best"], panel["subtitle"]
        ([5, 10, 15], [0.5, 0.8, 0.7], (10, 0.8), 'acc: best 0.8 at step 10 (max)')
    """
    if x not in ("epoch", "step"):
        raise ConfigError(NOT_AXIS.format(value=x))
    rows = list(h)
    best_row = h.best
    panels = []
    for name in _names(h, metrics):
        pairs = [(row[x], row[name]) for row in rows if row.get(name) is not None]
        xs = [px for px, _ in pairs]
        ys = [py for _, py in pairs]
        best = None
        if best_row is not None and best_row.get(name) is not None:
            best = (best_row[x], best_row[name])
        panels.append(
            {
                "name": name,
                "x": xs,
                "y": ys,
                "best": best,
                "subtitle": _subtitle(h, name, xs, ys, best, x),
            }
        )
    return {
        "title": history_title(h),
        "xlabel": "epoch" if x == "epoch" else "optimizer step",
        "panels": panels,
    }


def plot(
    h: MetricHistory,
    path: str | os.PathLike[str] | None = None,
    *,
    x: str = "epoch",
    metrics: str | Iterable[str] | None = "all",
    dpi: int = 120,
) -> Any:
    """Draw `history_series(h, x=x, metrics=metrics)` as a matplotlib Figure.

    By default every logged scalar metric, train_loss included (`metrics="all"`;
    None is `history_series`'s default, the checkpointer's metric), one panel each:
    stacked on a shared x axis, in two columns past three panels, the x ticks on
    whole epochs (or steps), the checkpointer's chosen epoch a red star on each
    panel. Needs the `plot` extra.

    Without `path`, the figure is pyplot's current figure, as pandas' plots are:
    `plt.savefig(...)`, `plt.show()` and a notebook's inline display all see it.
    With `path`, it is saved there (the format follows the suffix) and pyplot does
    not keep it, so a loop of saved plots holds no memory. `fig.savefig(...)` works
    either way.

    Returns:
        matplotlib.figure.Figure: the figure.

    Example (with matplotlib installed):

        h.plot("history.png")                  # every metric, saved
        fig = h.plot(metrics=["acc", "loss"])  # two panels; then plt.savefig(...)
    """
    series = history_series(h, x=x, metrics=metrics)
    panels = series["panels"]
    if not panels:
        extra = f" (non-scalar: {', '.join(h.non_scalar)})" if h.non_scalar else ""
        raise ConfigError(NOTHING_TO_PLOT.format(n=len(h), extra=extra))
    columns = 1 if len(panels) <= 3 else 2
    rows = -(-len(panels) // columns)
    size = (8.0 if columns == 1 else 12.0, 1.0 + 2.6 * rows)
    if path is None:  # pyplot's current figure: plt.savefig and plt.show see it
        pyplot = require("matplotlib.pyplot", extra="plot", feature="plot(h)")
        fig = pyplot.figure(figsize=size, layout="constrained")
    else:
        figure_module = require("matplotlib.figure", extra="plot", feature="plot(h)")
        fig = figure_module.Figure(figsize=size, layout="constrained")
    ticker = require("matplotlib.ticker", extra="plot", feature="plot(h)")
    grid = fig.subplots(rows, columns, sharex=True, squeeze=False)
    axes = [grid[i // columns, i % columns] for i in range(len(panels))]
    for ax, panel in zip(axes, panels, strict=True):
        _draw(ax, panel, h, ticker, legend=ax is axes[0])
    for ax in grid.flat[len(panels) :]:  # an odd count: the last slot stays empty
        ax.remove()
    for column in range(columns):  # the x axis's label under each column's last
        last = max(i for i in range(len(panels)) if i % columns == column)
        axes[last].set_xlabel(series["xlabel"])
        axes[last].xaxis.set_tick_params(labelbottom=True)
    fig.suptitle(series["title"])
    if path is not None:
        fig.savefig(os.fspath(path), dpi=dpi)
    return fig


def _draw(
    ax: Any, panel: dict[str, Any], h: MetricHistory, ticker: Any, *, legend: bool
) -> None:
    """One metric's panel: its line, the best point, whole-number x ticks."""
    few = len(panel["x"]) <= 60
    ax.plot(
        panel["x"],
        panel["y"],
        color="C0",
        linewidth=1.6,
        marker="o" if few else None,
        markersize=3,
    )
    if panel["best"] is not None:
        bx, by = panel["best"]
        ax.plot(
            [bx],
            [by],
            linestyle="none",
            marker="*",
            markersize=16,
            color="C3",
            markeredgecolor="black",
            markeredgewidth=0.6,
            zorder=3,
            label=f"best epoch ({h.best_epoch})",
        )
        ax.axvline(bx, color="C3", alpha=0.25, linewidth=1)
        if legend:
            ax.legend(loc="best", fontsize="small", frameon=False)
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))  # epochs are whole
    ax.set_title(panel["subtitle"], loc="left", fontsize="medium")
    ax.set_ylabel(panel["name"])
    ax.grid(alpha=0.3)
