"""The history's table: which rows thin_rows keeps, which columns fit, the plain-text
repr and the rich rendering.
"""

import random

import pytest
from history_rows import make_rows
from rich.console import Console

import jaxnitro as nx
from jaxnitro.observe.history import MetricHistory
from jaxnitro.observe.history_text import history_table, render_text, thin_rows


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
    t = history_table(h, 20, 56)
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
