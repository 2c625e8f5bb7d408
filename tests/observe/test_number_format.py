"""One rule for every printed number: four significant digits, a float always with
a decimal point, integers whole, seconds to a tenth."""

import numpy as np
import pytest
from history_rows import make_rows

from jaxnitro.observe.history import MetricHistory
from jaxnitro.observe.number_format import format_clock, format_number
from jaxnitro.observe.progress_line import epoch_summary, format_values


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (2.43912, "2.439"),
        (1.0, "1.0"),  # a ratio of 1 never reads as the integer 1
        (np.float32(1.0), "1.0"),
        (0.19469, "0.1947"),
        (0.5, "0.5"),
        (0.0, "0.0"),
        (-0.041683, "-0.04168"),
        (np.float32(0.1), "0.1"),  # float32's noise is not shown
        (123.456, "123.5"),
        (999.96, "1000"),
        (12345.6, "12346"),
        (3.2e-6, "3.2e-06"),
        (120, "120"),
        (np.int64(7), "7"),
        (float("nan"), "nan"),
        (float("inf"), "inf"),
    ],
)
def test_format_number(value, text):
    assert format_number(value) == text


def test_the_printed_lines_share_the_rule():
    row = {"epoch": 1, "step": 4, "train_loss": 2.43912, "acc": 1.0, "seconds": 0.19469}
    assert epoch_summary(row, 2) == "epoch 1/2: train_loss 2.439 · val acc 1.0 · 0.2 s"
    assert format_values({"loss": np.float32(0.41234)}) == "loss 0.4123"
    rows = make_rows(3)
    rows[0]["seconds"] = 0.19469
    text = repr(MetricHistory(rows))
    assert " 0.2" in text and "0.19469" not in text


def test_format_clock():
    assert [format_clock(s) for s in (0, 59.6, 3599, 3600)] == [
        "0:00",
        "1:00",
        "59:59",
        "1:00:00",
    ]
