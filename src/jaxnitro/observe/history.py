"""`MetricHistory`: the per-epoch series a handle keeps, as an immutable table.

Each trained epoch adds one row, `{"epoch", "step", "train_loss", <metrics>...,
"seconds"}`: `step` is the optimizer step the epoch ended on, `train_loss` the epoch's
mean train loss (NaN when it ran no micro-batch), the metrics that epoch's finalized
validation values under the names they were reported with (so the validation loss is
`loss`), and `seconds` the epoch's wall time.

Indexing follows the spec, in Python spelling. Integers and slices select epochs BY
NUMBER, strings select metrics, and a selection always keeps `epoch` and `step`:

    h[7]                      # the row for epoch 7, a dict
    h[-1]                     # the LAST row: negative integers count rows from the end
    h[10:20]                  # epochs 10 to 20 INCLUSIVE, still a MetricHistory
    h["acc", "macro_recall"]  # two metrics, every epoch
    h[10:20, "acc"]           # both
    h.select(step=range(5000, 20001))  # the epochs whose closing step is in the range
    h.acc                     # the column as a list (None where an epoch lacks it)
    h.column("loss/ce")       # the same, for a name that is not an identifier
"""

from __future__ import annotations

import csv
import math
import numbers
import os
from collections.abc import Container, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..extras import require
from ..logging.values import as_scalar

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions, RenderResult

LEADING = ("epoch", "step", "train_loss")
"""The columns every row starts with, in this order."""
TRAILING = ("seconds",)
"""Columns placed after every metric: bookkeeping, not a metric."""
AXES = ("epoch", "step")
"""The columns a metric selection always keeps."""

_REPR_HEIGHT = 30
_REPR_WIDTH = 100

BAD_ROW = (
    "MetricHistory row {index} is {value!r}: each row must be a mapping with an "
    "integer `epoch` and `step`, as the training loop writes them."
)
BAD_ORDER = (
    "MetricHistory row {index} has epoch {epoch} after epoch {previous}: epochs must "
    "strictly increase, since integers index rows by epoch number. Pass the rows in "
    "the order the epochs ran, without repeats."
)
BAD_SELECTION = (
    "MetricHistory selection_metric must be a (name, mode) pair with mode 'min' or "
    "'max', such as ('acc', 'max'), or None; got {value!r}."
)
BAD_RESUMED = (
    "MetricHistory resumed_from_epoch must be a non-negative integer (the last epoch "
    "an earlier handle trained) or None; got {value!r}."
)
NO_EPOCH = (
    "MetricHistory has no epoch {epoch}: it holds {held}. Positive integers are epoch "
    "numbers; h[-1] is the last row."
)
NO_POSITION = (
    "MetricHistory has {n} rows, so h[{index}] counts back past the first. Negative "
    "integers count rows from the end; positive integers are epoch numbers."
)
BAD_SLICE = (
    "h[{text}]: a slice selects epochs by number, both ends included, so its bounds "
    "must be non-negative integers or empty and it takes no step. For the last n "
    "epochs write h[h.epoch[-n]:]; for every k-th epoch, "
    "h.select(epoch=range(first, last + 1, k))."
)
NO_METRIC = (
    "MetricHistory has no {what} `{name}`: its columns are {columns}{extra}. Names "
    "are the ones validation reported, so the validation loss is `loss`."
)
BAD_KEY = (
    "MetricHistory cannot be indexed with {value!r}: use an epoch number (h[7]), a "
    "negative row position (h[-1]), an inclusive epoch slice (h[10:20]), metric "
    'names (h["acc"], h["acc", "loss"]) or an epoch selection then names '
    '(h[10:20, "acc"]).'
)
NOT_CONTAINER = (
    "MetricHistory.select({axis}=...) takes a container of {axis} numbers such as "
    "range(5000, 20001) or a set; got {value!r}."
)
IMMUTABLE = (
    "MetricHistory is immutable, so `{name}` cannot be set: build a new one, or "
    "select with h[...] or h.select(...)."
)


def _epochs_text(epochs: list[int]) -> str:
    if not epochs:
        return "no epochs"
    if epochs == list(range(epochs[0], epochs[-1] + 1)):
        return f"epochs {epochs[0]}..{epochs[-1]}"
    shown = ", ".join(str(e) for e in epochs[:8])
    return f"epochs {shown}{', ...' if len(epochs) > 8 else ''}"


def _names_text(names: Iterable[str]) -> str:
    return ", ".join(names) or "none"


class MetricHistory:
    """The per-epoch metric series of a handle: an immutable table of row dicts.

    Args:
        rows: one mapping per epoch, in the order the epochs ran, each with an integer
            `epoch` and `step`, usually `train_loss`, the validation metrics and
            `seconds`.
        selection_metric: the checkpointer's `(name, mode)`, mode "min" or "max": its
            column comes right after `train_loss`, and its best value picks the best
            row. None when nothing ranks the epochs.
        resumed_from_epoch: the last epoch an earlier handle trained before this one
            resumed, so the table notes that epochs up to it are not here. None for a
            fresh run.

    Columns are `epoch`, `step`, `train_loss`, the selection metric, the other scalar
    metrics in order of first appearance, then `seconds`; an epoch lacking a metric
    has None there. A non-scalar metric (a confusion matrix) is not a column:
    `non_scalar` lists it and `h.<name>` returns it per epoch. Integers index by EPOCH
    NUMBER, except that negative integers count rows from the end; slices select
    epoch numbers with BOTH ENDS INCLUDED. A metric whose name is not an identifier,
    or is one of this class's own names (`columns`, `best`, `select`, `plot`...),
    reads with `h.column(name)`. Values are host values: a 0-d array becomes a
    Python number, a non-scalar metric stays a NumPy array. The table is
    immutable: setting an attribute raises `AttributeError`.

    Raises:
        ConfigError: a row that is not a mapping or lacks an integer `epoch` or
            `step`; epochs that do not strictly increase; a `selection_metric`
            other than a `(name, "min" | "max")` pair or None; a
            `resumed_from_epoch` other than an int >= 0 or None.

    Examples:
        >>> h = MetricHistory(
        ...     [{"epoch": e, "step": 10 * e, "train_loss": 1 / e, "acc": e / 4}
        ...      for e in (1, 2, 3)],
        ...     selection_metric=("acc", "max"),
        ... )
        >>> h[2]
        {'epoch': 2, 'step': 20, 'train_loss': 0.5, 'acc': 0.5}
        >>> h[-1]["acc"], h.acc, h.best_epoch
        (0.75, [0.25, 0.5, 0.75], 3)
        >>> h[2:3, "acc"].columns
        ('epoch', 'step', 'acc')
        >>> len(h.select(step=range(15, 31)))
        2
    """

    __slots__ = (
        "_rows",
        "_columns",
        "_non_scalar",
        "_selection_metric",
        "_resumed_from_epoch",
        "_best_epoch",
        "_positions",
    )

    _rows: tuple[dict[str, Any], ...]
    _columns: tuple[str, ...]
    _non_scalar: tuple[str, ...]
    _selection_metric: tuple[str, str] | None
    _resumed_from_epoch: int | None
    _best_epoch: int | None
    _positions: dict[int, int]

    def __init__(
        self,
        rows: Iterable[Mapping[str, Any]] = (),
        *,
        selection_metric: tuple[str, str] | None = None,
        resumed_from_epoch: int | None = None,
    ) -> None:
        if selection_metric is not None:
            if (
                not isinstance(selection_metric, tuple | list)
                or len(selection_metric) != 2
                or not isinstance(selection_metric[0], str)
                or selection_metric[1] not in ("min", "max")
            ):
                raise ConfigError(BAD_SELECTION.format(value=selection_metric))
            selection_metric = (selection_metric[0], selection_metric[1])
        if resumed_from_epoch is not None and (
            not isinstance(resumed_from_epoch, numbers.Integral)
            or isinstance(resumed_from_epoch, bool)
            or resumed_from_epoch < 0
        ):
            raise ConfigError(BAD_RESUMED.format(value=resumed_from_epoch))
        normalized = tuple(_normalize(i, row) for i, row in enumerate(rows))
        for i in range(1, len(normalized)):
            previous, epoch = normalized[i - 1]["epoch"], normalized[i]["epoch"]
            if epoch <= previous:
                raise ConfigError(
                    BAD_ORDER.format(index=i, epoch=epoch, previous=previous)
                )
        self._init(
            normalized,
            selection_metric,
            None if resumed_from_epoch is None else int(resumed_from_epoch),
            _best_epoch(normalized, selection_metric),
            *_shape(normalized, selection_metric),
        )

    def _init(
        self,
        rows: tuple[dict[str, Any], ...],
        selection_metric: tuple[str, str] | None,
        resumed_from_epoch: int | None,
        best_epoch: int | None,
        columns: tuple[str, ...],
        non_scalar: tuple[str, ...],
    ) -> None:
        set_ = object.__setattr__
        set_(self, "_rows", rows)
        set_(self, "_columns", columns)
        set_(self, "_non_scalar", non_scalar)
        set_(self, "_selection_metric", selection_metric)
        set_(self, "_resumed_from_epoch", resumed_from_epoch)
        set_(self, "_best_epoch", best_epoch)
        set_(self, "_positions", {row["epoch"]: i for i, row in enumerate(rows)})

    def _derive(
        self, rows: tuple[dict[str, Any], ...], keep: Container[str] | None = None
    ) -> MetricHistory:
        """A selection with this table's metadata and columns (those in `keep`).

        The best epoch is kept while it is among the rows; an empty selection still
        has its columns.
        """
        new = object.__new__(MetricHistory)
        epochs = {row["epoch"] for row in rows}
        best = self._best_epoch if self._best_epoch in epochs else None
        new._init(
            rows,
            self._selection_metric,
            self._resumed_from_epoch,
            best,
            tuple(c for c in self._columns if keep is None or c in keep),
            tuple(c for c in self._non_scalar if keep is None or c in keep),
        )
        return new

    # ------------------------------------------------------------ table facts ------
    @property
    def columns(self) -> tuple[str, ...]:
        """The scalar columns, in display order (see the class docstring)."""
        return self._columns

    @property
    def non_scalar(self) -> tuple[str, ...]:
        """Metrics that are not columns (arrays such as a confusion matrix)."""
        return self._non_scalar

    @property
    def selection_metric(self) -> tuple[str, str] | None:
        """The checkpointer's `(name, mode)`, or None."""
        return self._selection_metric

    @property
    def resumed_from_epoch(self) -> int | None:
        """The last epoch an earlier handle trained before this one resumed."""
        return self._resumed_from_epoch

    @property
    def best_epoch(self) -> int | None:
        """The epoch with the best finite selection metric (the first on a tie)."""
        return self._best_epoch

    @property
    def best(self) -> dict[str, Any] | None:
        """The best epoch's row, or None without a selection metric or a score."""
        return None if self._best_epoch is None else self[self._best_epoch]

    def column(self, name: str) -> list[Any]:
        """One column (or non-scalar metric) as a list, None where a row lacks it.

        `h.acc` is `h.column("acc")`; `column` also reads a name that is not an
        identifier ("loss/ce") or that clashes with this class's own names.

        Args:
            name: a scalar column or a non-scalar metric.

        Returns:
            list[Any]: one value per row, in epoch order.

        Raises:
            KeyError: no such column or metric (the message lists them).
        """
        if name not in self._columns and name not in self._non_scalar:
            raise KeyError(self._no_metric("column", name))
        return [row.get(name) for row in self._rows]

    def _no_metric(self, what: str, name: str) -> str:
        extra = (
            f"; non-scalar metrics: {_names_text(self._non_scalar)}"
            if self._non_scalar
            else ""
        )
        return NO_METRIC.format(
            what=what, name=name, columns=_names_text(self._columns), extra=extra
        )

    def _full(self, row: dict[str, Any]) -> dict[str, Any]:
        full = {c: row.get(c) for c in self._columns}
        full.update({k: row[k] for k in self._non_scalar if k in row})
        return full

    # ------------------------------------------------------------ selection --------
    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (self._full(row) for row in self._rows)

    def __getattr__(self, name: str) -> list[Any]:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in self._columns or name in self._non_scalar:
            return self.column(name)
        raise AttributeError(
            self._no_metric("column", name)
            + " A name that is not an identifier reads as h.column('loss/ce')."
        )

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(IMMUTABLE.format(name=name))

    def __delattr__(self, name: str) -> None:
        raise AttributeError(IMMUTABLE.format(name=name))

    def __dir__(self) -> list[str]:
        names = [c for c in self._columns + self._non_scalar if c.isidentifier()]
        return sorted(set(super().__dir__()) | set(names))

    def __getitem__(self, key: Any) -> Any:
        """Select rows by epoch number and columns by metric name.

        Args:
            key: an int (a positive one is an EPOCH NUMBER, a negative one counts
                rows from the end), a slice of epoch numbers with both ends
                included and no step, a metric name, or a tuple: metric names,
                or an int or a slice followed by metric names.

        Returns:
            An int alone (or with names) gives the row as a dict (only `epoch`,
            `step` and the names, with names); anything else gives a
            `MetricHistory` holding the selected epochs and, with names, only
            `epoch`, `step` and those columns.

        Raises:
            KeyError: an epoch the table does not hold, or an unknown metric.
            IndexError: a negative int past the first row; a slice with a step, or
                a bound that is not a non-negative int.
            TypeError: a key of another type, or a tuple without names.
        """
        if isinstance(key, tuple):
            if key and isinstance(key[0], numbers.Integral | slice):
                epochs, names = key[0], key[1:]
            else:
                epochs, names = None, key
            if not names or not all(isinstance(n, str) for n in names):
                raise TypeError(BAD_KEY.format(value=key))
            if isinstance(epochs, numbers.Integral):
                row = self[epochs]
                return {k: row.get(k) for k in self._keep(names)}
            picked = self if epochs is None else self[epochs]
            return picked._metrics(names)
        if isinstance(key, str):
            return self._metrics((key,))
        if isinstance(key, slice):
            return self._epoch_slice(key)
        if isinstance(key, numbers.Integral) and not isinstance(key, bool):
            return self._row(int(key))
        raise TypeError(BAD_KEY.format(value=key))

    def _row(self, key: int) -> dict[str, Any]:
        if key < 0:
            if -key > len(self._rows):
                raise IndexError(NO_POSITION.format(n=len(self._rows), index=key))
            return self._full(self._rows[key])
        position = self._positions.get(key)
        if position is None:
            held = _epochs_text([row["epoch"] for row in self._rows])
            raise KeyError(NO_EPOCH.format(epoch=key, held=held))
        return self._full(self._rows[position])

    def _epoch_slice(self, key: slice) -> MetricHistory:
        bounds = (key.start, key.stop)
        if key.step is not None or not all(
            b is None or (isinstance(b, numbers.Integral) and int(b) >= 0)
            for b in bounds
        ):
            text = ":".join("" if b is None else repr(b) for b in (*bounds, key.step))
            raise IndexError(BAD_SLICE.format(text=text.rstrip(":")))
        low = -math.inf if key.start is None else int(key.start)
        high = math.inf if key.stop is None else int(key.stop)
        return self._derive(
            tuple(row for row in self._rows if low <= row["epoch"] <= high)
        )

    def _keep(self, names: tuple[str, ...]) -> list[str]:
        for name in names:
            if name not in self._columns and name not in self._non_scalar:
                raise KeyError(self._no_metric("metric", name))
        return list(dict.fromkeys([*AXES, *names]))

    def _metrics(self, names: tuple[str, ...]) -> MetricHistory:
        keep = self._keep(names)
        return self._derive(
            tuple({k: row[k] for k in keep if k in row} for row in self._rows), keep
        )

    def select(
        self,
        *metrics: str,
        epoch: Container[int] | None = None,
        step: Container[int] | None = None,
    ) -> MetricHistory:
        """The epochs whose number is in `epoch` and closing step in `step`.

        Args:
            metrics: metric names to keep (with epoch and step); none keeps all.
            epoch: a container of epoch numbers, such as `range(1, 31, 5)`; None
                keeps every epoch.
            step: a container of closing steps, such as `range(5000, 20001)`; None
                keeps every step.

        Returns:
            MetricHistory: the selected rows, with this table's selection metric
            and resume note (the best epoch only while it is among them).

        Raises:
            TypeError: `epoch` or `step` is not a container.
            KeyError: an unknown metric name.
        """
        for axis, wanted in (("epoch", epoch), ("step", step)):
            if wanted is not None and not isinstance(wanted, Container):
                raise TypeError(NOT_CONTAINER.format(axis=axis, value=wanted))
        rows = tuple(
            row
            for row in self._rows
            if (epoch is None or row["epoch"] in epoch)
            and (step is None or row["step"] in step)
        )
        picked = self._derive(rows)
        return picked._metrics(metrics) if metrics else picked

    # ------------------------------------------------------------ export -----------
    def to_pandas(self) -> Any:
        """A `pandas.DataFrame` of the scalar columns (needs the `pandas` extra).

        Returns:
            pandas.DataFrame: one row per epoch, one column per scalar column, in
            `columns` order.

        Raises:
            MissingExtraError: pandas is not installed.
        """
        pd = require("pandas", extra="pandas", feature="MetricHistory.to_pandas()")
        return pd.DataFrame(
            {c: self.column(c) for c in self._columns}, columns=list(self._columns)
        )

    def to_csv(self, path: str | os.PathLike[str]) -> None:
        """Write the scalar columns to `path` as CSV; a missing value is empty.

        Args:
            path: the file to write (overwritten); the header row is `columns`.
        """
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(self._columns)
            for row in self._rows:
                writer.writerow(
                    ["" if row.get(c) is None else row[c] for c in self._columns]
                )

    def plot(self, path: str | os.PathLike[str] | None = None, **kwargs: Any) -> Any:
        """`plot(h, path, ...)`: a matplotlib Figure (needs the `plot` extra).

        Every logged metric by default, one panel each on whole-number epoch
        ticks, the best epoch starred. Without `path` it is pyplot's current
        figure, so `plt.savefig(...)` saves it; `fig.savefig(...)` always works.

        Args:
            path: where to save the figure (the format follows the suffix), or
                None to save nothing.
            **kwargs: `x` ("epoch" or "step"), `metrics` ("all", the default; None
                for the checkpointer's metric; a name or a list of names) and
                `dpi`, as `jaxnitro.observe.plot` takes them.

        Returns:
            matplotlib.figure.Figure: the figure.

        Raises:
            ConfigError: `x` is neither "epoch" nor "step"; a metric named that is
                not a scalar column; nothing to plot (no scalar metric at all).
            MissingExtraError: matplotlib is not installed.
        """
        from .history_plot import plot

        return plot(self, path, **kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        state = (
            self._rows,
            self._selection_metric,
            self._resumed_from_epoch,
            self._best_epoch,
            self._columns,
            self._non_scalar,
        )
        return (_rebuild, state)

    # ------------------------------------------------------------ display ----------
    def __repr__(self) -> str:
        from .history_text import history_table, render_text

        return render_text(history_table(self, _REPR_HEIGHT, _REPR_WIDTH))

    def __rich_console__(
        self, console: Console, options: ConsoleOptions
    ) -> RenderResult:
        from .history_text import history_table, render_rich

        height = options.height or console.height
        yield render_rich(history_table(self, height, options.max_width))


def _normalize(index: int, row: Any) -> dict[str, Any]:
    if not isinstance(row, Mapping):
        raise ConfigError(BAD_ROW.format(index=index, value=row))
    out: dict[str, Any] = {}
    for key, value in row.items():
        ok, plain = as_scalar(value)
        out[str(key)] = plain if ok else value
    for axis in AXES:
        value = out.get(axis)
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(BAD_ROW.format(index=index, value=dict(row)))
    return out


def _is_scalar(value: Any) -> bool:
    """Whether a value of a `_normalize`d row is a scalar: None, bool, int or float."""
    return value is None or isinstance(value, int | float)


def _best_epoch(
    rows: tuple[dict[str, Any], ...], selection_metric: tuple[str, str] | None
) -> int | None:
    if selection_metric is None:
        return None
    name, mode = selection_metric
    best: tuple[float, int] | None = None
    for row in rows:
        value = row.get(name)
        if not isinstance(value, int | float) or not math.isfinite(value):
            continue
        score = -value if mode == "max" else value
        if best is None or score < best[0]:
            best = (score, row["epoch"])
    return None if best is None else best[1]


def _shape(
    rows: tuple[dict[str, Any], ...], selection_metric: tuple[str, str] | None
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The scalar columns in display order, and the non-scalar metrics."""
    scalar: dict[str, bool] = dict.fromkeys(AXES, True)
    for row in rows:
        for key, value in row.items():
            scalar[key] = scalar.get(key, True) and _is_scalar(value)
    chosen = selection_metric[0] if selection_metric is not None else None
    leading = [c for c in LEADING if scalar.get(c)]
    if chosen is not None and scalar.get(chosen) and chosen not in leading:
        leading.append(chosen)
    trailing = [c for c in TRAILING if scalar.get(c) and c not in leading]
    middle = [c for c, ok in scalar.items() if ok and c not in leading + trailing]
    columns = tuple(leading + middle + trailing)
    return columns, tuple(c for c, ok in scalar.items() if not ok)


def _rebuild(*state: Any) -> MetricHistory:
    """Unpickle: the stored rows, metadata and columns, as they were."""
    new = object.__new__(MetricHistory)
    new._init(*state)
    return new
