"""MetricHistory: columns and rows, indexing, refusals, export, and a real run's."""

import csv
import math
import pickle
import sys

import numpy as np
import pytest
from experiments import TinyMetrics

import jaxnitro as nx
from jaxnitro.errors import MissingExtraError
from jaxnitro.extras import require
from jaxnitro.observe.history import MetricHistory


# ------------------------------------------------------------ columns and rows ------
def test_columns_order_selection_metric_after_train_loss_and_seconds_last(h):
    assert h.columns == (
        "epoch",
        "step",
        "train_loss",
        "macro_recall",
        "loss",
        "acc",
        "seconds",
    )
    assert h.non_scalar == ("confusion",)
    assert len(h) == 30


def test_a_metric_an_epoch_lacks_is_none_and_new_metrics_append():
    h = MetricHistory(
        [
            {"epoch": 1, "step": 5, "train_loss": 1.0, "seconds": 0.1},
            {"epoch": 2, "step": 9, "train_loss": 0.5, "acc": 0.7, "seconds": 0.1},
        ]
    )
    assert h.columns == ("epoch", "step", "train_loss", "acc", "seconds")
    assert h.acc == [None, 0.7]
    assert h[1] == {
        "epoch": 1,
        "step": 5,
        "train_loss": 1.0,
        "acc": None,
        "seconds": 0.1,
    }


def test_scalars_become_python_numbers_and_non_scalars_stay_per_epoch(h):
    assert type(h.acc[0]) is float and type(h.step[0]) is int
    assert h.acc[0] == pytest.approx(0.77)
    np.testing.assert_array_equal(h.confusion[2], np.eye(3, dtype=int) * 3)
    assert "confusion" in dir(h) and "acc" in dir(h)
    assert "confusion" in h[3]


def test_a_metric_scalar_in_one_epoch_and_an_array_in_another_is_not_a_column():
    h = MetricHistory(
        [{"epoch": 1, "step": 1, "m": 0.5}, {"epoch": 2, "step": 2, "m": [1, 2]}]
    )
    assert h.columns == ("epoch", "step") and h.non_scalar == ("m",)


def test_the_selection_metric_picks_the_best_epoch_first_on_a_tie():
    rows = [
        {"epoch": 1, "step": 1, "loss": 0.5},
        {"epoch": 2, "step": 2, "loss": float("nan")},
        {"epoch": 3, "step": 3, "loss": 0.2},
        {"epoch": 4, "step": 4, "loss": 0.2},
        {"epoch": 5, "step": 5},
    ]
    low = MetricHistory(rows, selection_metric=("loss", "min"))
    assert low.best_epoch == 3 and low.best["loss"] == 0.2
    assert MetricHistory(rows, selection_metric=("loss", "max")).best_epoch == 1
    assert MetricHistory(rows).best is None
    assert MetricHistory(rows, selection_metric=("acc", "max")).best_epoch is None


# ------------------------------------------------------------ indexing --------------
def test_integers_index_epoch_numbers_and_negative_integers_positions(h):
    assert h[7]["epoch"] == 7 and h[7]["step"] == 700
    assert h[-1]["epoch"] == 30 and h[-30]["epoch"] == 1
    later = h[20:]
    assert later[20]["epoch"] == 20 and later[-1]["epoch"] == 30


def test_slices_select_epochs_inclusive(h):
    assert h[10:20].epoch == list(range(10, 21))
    assert h[:3].epoch == [1, 2, 3] and h[28:].epoch == [28, 29, 30]
    assert h[40:50].epoch == [] and len(h[:]) == 30


def test_names_select_metrics_always_keeping_epoch_and_step(h):
    assert h["acc"].columns == ("epoch", "step", "acc")
    assert h["acc", "macro_recall"].columns == (
        "epoch",
        "step",
        "macro_recall",
        "acc",
    )
    both = h[10:20, "acc"]
    assert both.epoch == list(range(10, 21)) and both.columns == (
        "epoch",
        "step",
        "acc",
    )
    assert h[7, "acc"] == {"epoch": 7, "step": 700, "acc": pytest.approx(0.83)}
    assert h["confusion"].non_scalar == ("confusion",)


def test_select_by_closing_step_and_epoch_containers(h):
    assert h.select(step=range(500, 1001)).epoch == [5, 6, 7, 8, 9, 10]
    assert h.select(epoch={1, 3}).step == [100, 300]
    picked = h.select("loss", epoch=range(1, 31, 10))
    assert picked.columns == ("epoch", "step", "loss") and picked.epoch == [1, 11, 21]


def test_selections_keep_the_best_epoch_while_it_is_selected(h):
    assert h.best_epoch == 19
    assert h["acc"].best_epoch == 19 and h["acc"].best["acc"] == pytest.approx(0.95)
    assert h[10:20].best_epoch == 19
    assert h[1:5].best_epoch is None and h[1:5].best is None


def test_column_reads_names_that_are_not_identifiers():
    h = MetricHistory([{"epoch": 1, "step": 1, "loss/ce": 0.3}])
    assert h.column("loss/ce") == [0.3]
    assert h["loss/ce"].columns == ("epoch", "step", "loss/ce")


def test_iteration_and_pickling(h):
    assert [row["epoch"] for row in h] == list(range(1, 31))
    again = pickle.loads(pickle.dumps(h["acc"][3:9]))
    assert again.epoch == list(range(3, 10)) and again.best_epoch is None
    assert pickle.loads(pickle.dumps(h)).best_epoch == 19


# ------------------------------------------------------------ refusals --------------
def test_an_absent_epoch_names_the_epochs_there_are(h):
    with pytest.raises(KeyError, match=r"no epoch 31: it holds epochs 1\.\.30"):
        h[31]
    with pytest.raises(KeyError, match=r"no epoch 0.*h\[-1\] is the last row"):
        h[0]
    gappy = MetricHistory([{"epoch": e, "step": e} for e in (2, 4)])
    with pytest.raises(KeyError, match="it holds epochs 2, 4"):
        gappy[3]


def test_a_negative_position_past_the_first_row_is_refused(h):
    with pytest.raises(IndexError, match=r"has 30 rows, so h\[-31\] counts back"):
        h[-31]
    with pytest.raises(IndexError, match=r"has 0 rows"):
        MetricHistory()[-1]


@pytest.mark.parametrize(
    ("key", "text"),
    [
        (slice(-5, None), r"h\[-5\]"),
        (slice(1, 10, 2), r"h\[1:10:2\]"),
        (slice(1.5, 3), r"h\[1\.5:3\]"),
    ],
)
def test_slices_take_non_negative_epoch_bounds_and_no_step(h, key, text):
    with pytest.raises(IndexError, match=text + r": a slice selects epochs by number"):
        h[key]


def test_an_unknown_metric_names_the_columns(h):
    with pytest.raises(KeyError, match=r"no metric `acc5`: its columns are epoch"):
        h["acc5"]
    with pytest.raises(KeyError, match="non-scalar metrics: confusion"):
        h[1:3, "acc", "acc5"]
    with pytest.raises(KeyError, match="no column `acc5`"):
        h.column("acc5")
    with pytest.raises(AttributeError, match=r"no column `acc5`.*h\.column"):
        _ = h.acc5
    assert not hasattr(h, "_private")  # private names are never columns


@pytest.mark.parametrize("key", [1.5, None, (1, 2), ("acc", 3), (slice(1, 2),)])
def test_other_keys_are_refused_with_the_forms_that_work(h, key):
    with pytest.raises(TypeError, match="cannot be indexed with"):
        h[key]


def test_select_takes_containers(h):
    with pytest.raises(TypeError, match=r"select\(step=\.\.\.\) takes a container"):
        h.select(step=500)


def test_it_is_immutable(h):
    with pytest.raises(AttributeError, match="immutable, so `acc` cannot be set"):
        h.acc = [1]
    with pytest.raises(AttributeError, match="immutable, so `_rows` cannot be set"):
        del h._rows


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([[1, 2]], r"row 0 is \[1, 2\]: each row must be a mapping"),
        ([{"step": 1}], r"row 0 is \{'step': 1\}: .* integer `epoch` and `step`"),
        ([{"epoch": 1, "step": 1.5}], r"row 0 is .*integer `epoch` and `step`"),
        (
            [{"epoch": 2, "step": 2}, {"epoch": 2, "step": 3}],
            "row 1 has epoch 2 after epoch 2: epochs must strictly increase",
        ),
    ],
)
def test_rows_are_checked_at_construction(rows, message):
    with pytest.raises(nx.ConfigError, match=message):
        MetricHistory(rows)


@pytest.mark.parametrize("selection", [("acc",), ("acc", "up"), "acc", (1, "max")])
def test_selection_metric_is_a_name_and_mode(selection):
    with pytest.raises(nx.ConfigError, match="selection_metric must be a"):
        MetricHistory([], selection_metric=selection)


@pytest.mark.parametrize("resumed", [-1, 2.0, True])
def test_resumed_from_epoch_is_a_non_negative_integer(resumed):
    with pytest.raises(nx.ConfigError, match="resumed_from_epoch must be a non-neg"):
        MetricHistory([], resumed_from_epoch=resumed)


# ------------------------------------------------------------ export ----------------
def test_to_csv_writes_the_scalar_columns(h, tmp_path):
    path = tmp_path / "h.csv"
    h[1:3].to_csv(path)
    with open(path, newline="") as f:
        lines = list(csv.reader(f))
    assert lines[0] == list(h.columns)
    assert lines[1][:3] == ["1", "100", "2.0"] and len(lines) == 4
    assert float(lines[2][h.columns.index("acc")]) == pytest.approx(0.78)
    MetricHistory([{"epoch": 1, "step": 1, "acc": None}]).to_csv(path)
    assert path.read_text().splitlines()[1] == "1,1,"


def test_to_pandas(h):
    pytest.importorskip("pandas")
    frame = h.to_pandas()
    assert list(frame.columns) == list(h.columns)
    assert frame["epoch"].tolist() == list(range(1, 31))
    assert frame.loc[18, "macro_recall"] == pytest.approx(0.94)


def test_to_pandas_without_pandas_names_the_extra(h, monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(
        MissingExtraError,
        match=r"MetricHistory\.to_pandas\(\) needs the `pandas` package.*"
        r"pip install 'jaxnitro\[pandas\]'",
    ):
        h.to_pandas()


def test_require_imports_or_names_the_extra():
    assert require("math", extra="x", feature="y").pi == math.pi
    with pytest.raises(ImportError, match=r"Install the `plot` extra"):
        require("no_such_module_here", extra="plot", feature="plot(h)")


# ------------------------------------------------------------ from a real run -------
def test_a_trained_handles_rows_make_a_history(tmp_path):
    nitro = nx.Nitro(
        TinyMetrics(max_epochs=2), run_dir=str(tmp_path), logger=None, checkpointer=None
    )
    nitro.train()
    h = MetricHistory(nitro.history, selection_metric=("acc", "max"))
    assert h.columns == ("epoch", "step", "train_loss", "acc", "seconds")
    assert h.non_scalar == ("confusion",) and h.step == [4, 8]
    rows = list(nitro.history)
    accs = [row["acc"] for row in rows]
    best = rows[accs.index(max(accs))]["epoch"]  # the highest acc, first on a tie
    assert h.best_epoch == best and h.confusion[0].shape == (3, 3)
