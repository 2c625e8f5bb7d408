"""What a person sees while training: the latest values on the progress line, and
one summary line per epoch on stderr when nobody watches a terminal."""

from __future__ import annotations

import io
import logging
import re
import sys

import pytest
from experiments import TinyMetrics

import jaxnitro as nx
from jaxnitro.observe.progress import progress_reporter
from jaxnitro.observe.progress_bar import BarReporter
from jaxnitro.observe.progress_line import ProgressLine
from jaxnitro.observe.progress_log import LogReporter


class Events:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def __call__(self, verb, label, total, epoch, max_epochs) -> None:
        self.calls.append((verb, label))

    def labels(self, verb: str) -> list[str]:
        return [label for v, label in self.calls if v == verb]


def quiet(**kw):
    return {"logger": None, "checkpointer": None, **kw}


def test_a_run_off_a_terminal_writes_one_summary_line_per_epoch(monkeypatch):
    stderr = io.StringIO()  # a log file: no terminal, no logging handler
    monkeypatch.setattr(sys, "stderr", stderr)
    nitro = nx.Nitro(TinyMetrics(max_epochs=2), **quiet())
    nitro.train()
    lines = stderr.getvalue().splitlines()
    assert len(lines) == 2
    for line, row in zip(lines, nitro.history, strict=True):
        match = re.fullmatch(
            r"epoch (\d)/2: train_loss (\S+) · val acc (\S+) · (\d+\.\d) s", line
        )
        assert match is not None, line
        epoch, loss, acc, _ = match.groups()
        assert int(epoch) == row["epoch"]
        assert float(loss) == pytest.approx(row["train_loss"], rel=1e-3)
        assert float(acc) == pytest.approx(row["acc"], rel=1e-3)


def test_progress_reporter_none_turns_the_summary_lines_off(monkeypatch):
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    previous = progress_reporter(None)
    try:
        nx.Nitro(TinyMetrics(max_epochs=1), **quiet()).train()
    finally:
        progress_reporter(previous)
    assert stderr.getvalue() == ""


def test_the_line_shows_the_latest_train_loss_and_then_the_monitored_metric():
    events = Events()
    previous = progress_reporter(events)
    try:
        nitro = nx.Nitro(TinyMetrics(max_epochs=1), **quiet())
        nitro.train()
    finally:
        progress_reporter(previous)
    shown = events.labels("metrics")
    assert len(shown) == 5  # one per train step, then one after validation
    assert all(re.fullmatch(r"loss \S+", text) for text in shown[:4])
    acc = nitro.history[1]["acc"]
    assert shown[-1] == f"{shown[3]} · val acc {acc:.4g}"
    assert events.labels("epoch") == [
        f"epoch 1/1: train_loss {nitro.history[1]['train_loss']:.4g} · "
        f"val acc {acc:.4g} · {nitro.history[1]['seconds']:.1f} s"
    ]


def test_the_bar_draws_the_values_after_the_stretch():
    line = ProgressLine()
    line.begin("train", 4, 3, 40)
    line.values = "loss 0.4123 · val acc 0.9031"
    assert line.description() == "epoch 3/40: train · loss 0.4123 · val acc 0.9031"
    out = io.StringIO()
    from rich.console import Console

    bar = BarReporter(console=Console(file=out, width=120, force_terminal=False))
    bar("begin", "train", 2, 1, 1)
    bar("metrics", "loss 0.5", 0, 1, 1)
    assert bar.line.description() == "epoch 1/1: train · loss 0.5"
    bar("epoch", "epoch 1/1: train_loss 0.5 · 0.1 s", 0, 1, 1)  # the line says it
    bar("done", "", 0, 0, 0)
    assert "epoch 1/1: train_loss" not in out.getvalue()


def test_the_log_reporter_records_each_epoch_summary():
    stream = io.StringIO()
    logger = logging.getLogger("test.progress.summary")
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        reporter = LogReporter(logger, clock=lambda: 0.0)
        reporter("begin", "train", 2, 1, 1)
        reporter("metrics", "loss 0.5", 0, 1, 1)  # within the interval: not written
        reporter("epoch", "epoch 1/1: train_loss 0.5 · 0.1 s", 0, 1, 1)
    finally:
        logger.removeHandler(handler)
    assert stream.getvalue().splitlines() == [
        "  0% epoch 1/1: train",
        "  0% epoch 1/1: train_loss 0.5 · 0.1 s",
    ]
