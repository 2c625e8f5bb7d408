"""The history's series and plot: the metrics each panel draws, the chosen epoch
marked, and the extra it needs.
"""

import math
import sys

import pytest
from history_rows import make_rows

import jaxnitro as nx
from jaxnitro.errors import MissingExtraError
from jaxnitro.observe.history import MetricHistory
from jaxnitro.observe.history_plot import history_series, plot


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
    every = [c for c in h.columns if c not in ("epoch", "step", "seconds")]
    drawn = h.plot(tmp_path / "again.png").get_axes()
    assert [ax.get_ylabel() for ax in drawn] == every  # every metric by default
    assert every[:2] == ["train_loss", "macro_recall"]


def test_plot_without_matplotlib_names_the_extra(h, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    with pytest.raises(
        MissingExtraError, match=r"plot\(h\) needs the `matplotlib\.pyplot` package"
    ):
        plot(h)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(
        MissingExtraError, match=r"plot\(h\) needs the `matplotlib\.figure` package"
    ):
        plot(h, tmp_path / "h.png")


def pixel_spread(path) -> float:
    """The variance of an image's pixels: 0 for a blank (one-colour) image."""
    from matplotlib import image

    return float(image.imread(str(path))[..., :3].var())


def test_h_plot_draws_every_metric_on_whole_epochs_and_plt_savefig_saves_it(
    tmp_path,
):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [
        {"epoch": e, "step": 4 * e, "train_loss": 2.4 / e, "loss": 2.0 / e, "acc": a}
        for e, a in ((1, 0.5), (2, 0.8), (3, 0.9))
    ]
    h = MetricHistory(rows, selection_metric=("acc", "max"))
    fig = h.plot()
    try:
        assert plt.gcf() is fig  # pyplot's current figure: plt.savefig sees it
        axes = fig.get_axes()
        assert [ax.get_ylabel() for ax in axes] == ["train_loss", "acc", "loss"]
        fig.canvas.draw()
        for ax in axes:  # whole epochs only, never 1.5 or 2.5
            ticks = [t for t in ax.get_xticks() if 1 <= t <= 3]
            assert ticks == [1.0, 2.0, 3.0], ax.get_xticks()
        assert axes[-1].get_xlabel() == "epoch"
        plt.savefig(tmp_path / "plt.png")
        fig.savefig(tmp_path / "fig.png")
    finally:
        plt.close(fig)
    assert pixel_spread(tmp_path / "plt.png") > 0  # not a blank image
    assert pixel_spread(tmp_path / "fig.png") > 0
    # Saved to a path, the figure is not left in pyplot's registry.
    open_before = plt.get_fignums()
    h.plot(tmp_path / "path.png")
    assert pixel_spread(tmp_path / "path.png") > 0
    assert plt.get_fignums() == open_before


def test_many_metrics_plot_in_two_columns_with_the_x_axis_under_each():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    rows = [
        {"epoch": e, "step": e, "train_loss": 1.0 / e, "a": e, "b": 2 * e, "c": 3 * e}
        for e in (1, 2)
    ]
    import matplotlib.pyplot as plt

    fig = plot(MetricHistory(rows))

    try:
        axes = fig.get_axes()
        assert len(axes) == 4  # two rows of two, no empty panel
        assert [ax.get_xlabel() for ax in axes] == ["", "", "epoch", "epoch"]
    finally:
        plt.close(fig)


def test_plot_with_nothing_to_draw_says_so():
    h = MetricHistory([{"epoch": 1, "step": 1, "m": [1, 2]}])
    with pytest.raises(nx.ConfigError, match=r"nothing to draw: .* 1 epochs .*\(non"):
        plot(h)
