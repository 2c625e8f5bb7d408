"""MetricHistory: indexing, columns, export, the terminal table and the plot."""

import csv
import math
import pickle
import random
import sys

import numpy as np
import pytest
from experiments import TinyMetrics
from rich.console import Console

import jaxnitro as nx
from jaxnitro.errors import MissingExtraError
from jaxnitro.extras import require
from jaxnitro.observe.history import MetricHistory
from jaxnitro.observe.history_plot import history_series, plot
from jaxnitro.observe.history_table import history_table, render_text, thin_rows


def make_rows(n=30, *, peak=19):
    rows = []
    for e in range(1, n + 1):
        acc = 0.95 - abs(e - peak) / 100
        rows.append(
            {
                "epoch": e,
                "step": 100 * e,
                "train_loss": 2.0 / e,
                "loss": 2.2 / e + 0.01 * abs(e - peak),
                "acc": np.float32(acc),
                "macro_recall": acc - 0.01,
                "confusion": np.eye(3, dtype=int) * e,
                "seconds": 1.5,
            }
        )
    return rows


@pytest.fixture
def h():
    return MetricHistory(make_rows(), selection_metric=("macro_recall", "max"))


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


# ------------------------------------------------------------ thin_rows -------------
def test_thin_rows_grows_windows_round_robin_with_twice_the_context_at_best():
    assert thin_rows(30, 14, 10) == [0, 1, 2, None, 13, 14, 15, None, 28, 29]
    assert thin_rows(30, 14, 14) == (
        [0, 1, 2, 3, None, 12, 13, 14, 15, 16, None, 27, 28, 29]
    )
    assert thin_rows(30, None, 7) == [0, 1, 2, None, 27, 28, 29]
    assert thin_rows(5, 2, 5) == [0, 1, 2, 3, 4]
    assert thin_rows(0, None, 5) == []


def test_thin_rows_with_a_tiny_budget_keeps_best_then_last_then_first():
    assert thin_rows(30, 14, 0) == []
    assert thin_rows(30, 14, 1) == [14]
    assert thin_rows(30, 14, 2) == [13, 14]
    assert thin_rows(30, 14, 3) == [14, None, 29]
    assert thin_rows(30, 14, 4) == [13, 14, None, 29]
    assert thin_rows(30, None, 2) == [28, 29]
    assert thin_rows(30, 29, 4) == [0, 1, None, 29]


def test_thin_rows_invariants_over_many_cases():
    rng = random.Random(0)
    for _ in range(400):
        n = rng.randrange(0, 60)
        budget = rng.randrange(0, 25)
        best = rng.choice([None, rng.randrange(n)]) if n else None
        out = thin_rows(n, best, budget)
        assert len(out) <= budget
        rows = [r for r in out if r is not None]
        assert rows == sorted(set(rows))
        if n <= budget:
            assert out == list(range(n))
            continue
        if budget >= 1 and best is not None:
            assert best in rows
        if budget >= 5:
            assert {0, n - 1} <= set(rows)
        for a, b in zip(out, out[1:], strict=False):
            assert not (a is None and b is None)
            if a is not None and b is not None:
                assert b == a + 1
            elif a is not None and b is None:
                assert out[out.index(a) + 2] > a + 1
        assert not out or (out[0] is not None and out[-1] is not None)
        assert len(out) >= budget - 1  # the budget is spent (a gap may cost 0 or 1)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((-1, None, 3), r"thin_rows\(n=-1\): n must be >= 0"),
        ((3, None, -2), r"thin_rows\(budget=-2\): budget must be >= 0"),
        ((3, 3, 2), r"thin_rows\(best=3\): best must be None or in range\(3\)"),
    ],
)
def test_thin_rows_checks_its_arguments(args, message):
    with pytest.raises(nx.ConfigError, match=message):
        thin_rows(*args)


# ------------------------------------------------------------ the table -------------
def test_history_table_thins_rows_and_drops_columns_from_the_right(h):
    t = history_table(h, 20, 60)
    assert t["labels"] == ["epoch", "step", "train_loss", "macro_recall", "loss"]
    assert t["alignment"] == ["right"] * 5
    picked = [row[0] for row in t["cells"]]
    assert picked[t["best_row"]] == "19"
    assert all(set(t["cells"][k]) == {"⋮"} for k in t["gap_rows"])
    assert picked[0] == "1" and picked[-1] == "30"
    assert (
        "Not shown for width: acc, seconds; select with h['acc', 'seconds']."
        in (t["note"])
    )
    assert "Non-scalar metrics (not columns): confusion; read h.confusion." in t["note"]
    assert t["title"] == (
        "MetricHistory: epochs 1..30 (30 rows), best epoch 19 by macro_recall (max)"
    )


def test_history_table_keeps_the_fixed_columns_however_narrow(h):
    t = history_table(h, 100, 10)
    assert t["labels"] == ["epoch", "step", "train_loss", "macro_recall"]
    assert t["gap_rows"] == [] and len(t["cells"]) == 30
    assert "Showing" not in t["note"]


def test_the_note_says_earlier_epochs_were_trained_before_the_resume():
    h = MetricHistory(make_rows()[6:], resumed_from_epoch=6)
    note = history_table(h, 40, 200)["note"]
    assert note.startswith(
        "Epochs 1..6 were trained before this handle resumed, so its history "
        "starts at epoch 7."
    )
    assert "trained before this handle resumed" in repr(h)


def test_an_empty_history_renders():
    empty = MetricHistory()
    assert repr(empty) == "MetricHistory: no epochs"
    assert history_table(empty, 10, 40)["cells"] == []


def test_repr_is_a_plain_text_table_with_the_best_row_marked(h):
    text = repr(h)
    lines = text.splitlines()
    assert lines[0].startswith("MetricHistory: epochs 1..30")
    assert lines[1].split() == list(history_table(h, 30, 100)["labels"])
    best = [line for line in lines if line.startswith("*")]
    assert len(best) == 1 and best[0].split()[1] == "19"
    assert str(h) == text
    assert render_text(history_table(h, 16, 40)).count("⋮") > 0


@pytest.mark.parametrize(("height", "width"), [(20, 70), (12, 50), (40, 120)])
def test_rich_rendering_fits_the_terminal(h, height, width):
    console = Console(width=width, height=height, record=True, force_terminal=False)
    console.print(h)
    lines = console.export_text().splitlines()
    assert len(lines) <= height
    assert all(len(line) <= width for line in lines)
    text = " ".join(" ".join(lines).split())
    assert "confusion; read h.confusion." in text
    assert ("h[a:b] selects" in text) == (height < 36)  # markup-free
    assert any(line.split("│")[1].strip() == "19" for line in lines if "│" in line)


# ------------------------------------------------------------ series and plot -------
def test_history_series_defaults_to_the_selection_metric(h):
    series = history_series(h)
    assert series["xlabel"] == "epoch" and series["title"].startswith("MetricHistory")
    (panel,) = series["panels"]
    assert panel["name"] == "macro_recall" and panel["x"] == list(range(1, 31))
    assert panel["best"] == (19, pytest.approx(0.94))
    assert panel["subtitle"] == "macro_recall: best 0.94 at epoch 19 (max)"


def test_history_series_metric_choices():
    plain = MetricHistory(make_rows(5))
    names = [p["name"] for p in history_series(plain)["panels"]]
    assert names == ["loss", "acc", "macro_recall"]
    losses = MetricHistory([{"epoch": 1, "step": 1, "train_loss": 1.0}])
    assert [p["name"] for p in history_series(losses)["panels"]] == ["train_loss"]
    all_names = [p["name"] for p in history_series(plain, metrics="all")["panels"]]
    assert all_names == ["train_loss", "loss", "acc", "macro_recall"]
    one = history_series(plain, x="step", metrics="loss")
    assert one["xlabel"] == "optimizer step" and one["panels"][0]["x"][:2] == [100, 200]
    assert one["panels"][0]["best"] is None
    assert one["panels"][0]["subtitle"] == "loss: last 0.58 at step 500"


def test_history_series_marks_the_chosen_epoch_on_every_panel_and_skips_gaps():
    rows = [
        {"epoch": 1, "step": 1, "acc": 0.5, "loss": 1.0},
        {"epoch": 2, "step": 2, "acc": 0.9, "loss": float("nan")},
        {"epoch": 3, "step": 3, "acc": 0.7},
    ]
    h = MetricHistory(rows, selection_metric=("acc", "max"))
    acc, loss = history_series(h, metrics=["acc", "loss"])["panels"]
    assert acc["best"] == (2, 0.9) and loss["x"] == [1, 2]
    assert math.isnan(loss["y"][1]) and math.isnan(loss["best"][1])
    assert loss["subtitle"] == "loss: nan at the best epoch (2)"


def test_history_series_refuses_unknown_axes_and_metrics(h):
    with pytest.raises(nx.ConfigError, match="x must be 'epoch' or 'step'; got 'time'"):
        history_series(h, x="time")
    with pytest.raises(nx.ConfigError, match="cannot draw `acc5`: the history has no"):
        history_series(h, metrics=["acc", "acc5"])
    with pytest.raises(nx.ConfigError, match="cannot draw `confusion`: it is not a"):
        history_series(h, metrics="confusion")


def test_plot_writes_a_png_with_the_best_point_marked(h, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "history.png"
    fig = plot(h, path, metrics=["macro_recall", "loss", "train_loss"])
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    axes = fig.get_axes()
    assert [ax.get_ylabel() for ax in axes] == ["macro_recall", "loss", "train_loss"]
    for ax in axes:
        stars = [line for line in ax.get_lines() if line.get_marker() == "*"]
        assert len(stars) == 1 and list(stars[0].get_xdata()) == [19]
    assert axes[0].get_title(loc="left").startswith("macro_recall: best 0.94")
    assert h.plot(tmp_path / "again.png").get_axes()[0].get_ylabel() == "macro_recall"


def test_plot_without_matplotlib_names_the_extra(h, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(
        MissingExtraError, match=r"plot\(h\) needs the `matplotlib\.figure` package"
    ):
        plot(h)


def test_plot_with_nothing_to_draw_says_so():
    h = MetricHistory([{"epoch": 1, "step": 1, "m": [1, 2]}])
    with pytest.raises(nx.ConfigError, match=r"nothing to draw: .* 1 epochs .*\(non"):
        plot(h)


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
