"""What a person sees while training: the latest values on the progress line, and
one summary line per epoch on stderr when nobody watches a terminal."""

from __future__ import annotations

import io
import logging
import re
import sys

import pytest
from experiments import QuietLogger, TinyMetrics

import jaxnitro as nx
from jaxnitro.observe import progress as progress_module
from jaxnitro.observe.progress import Progress, progress_reporter
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


class TrainLosses(QuietLogger):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def log_metrics(self, metrics, *, step, epoch, context, **kw):
        if context == "train":
            self.losses.append(metrics["loss"])


def test_the_line_shows_the_latest_train_loss_and_then_the_monitored_metric():
    events, lines = Events(), TrainLosses()
    previous = progress_reporter(events)
    try:
        nitro = nx.Nitro(
            TinyMetrics(max_epochs=1),
            logger=lines,
            checkpointer=None,
            log_every_n_steps=1,
        )
        nitro.train()
    finally:
        progress_reporter(previous)
    shown = events.labels("metrics")
    assert shown[0] == f"loss {lines.losses[0]:.4g}"  # the first step, at once
    acc = nitro.history[1]["acc"]
    assert shown[-1] == f"loss {lines.losses[-1]:.4g} · val acc {acc:.4g}"
    assert events.labels("epoch") == [
        f"epoch 1/1: train_loss {nitro.history[1]['train_loss']:.4g} · "
        f"val acc {acc:.4g} · {nitro.history[1]['seconds']:.1f} s"
    ]


def test_the_per_step_loss_reaches_the_line_at_most_ten_times_a_second(monkeypatch):
    assert progress_module.SHOW_INTERVAL_S == 0.1
    monkeypatch.setattr(progress_module, "SHOW_INTERVAL_S", 60.0)  # a loaded machine
    events = Events()
    previous = progress_reporter(events)
    try:
        with Progress() as progress:
            progress.begin("train", 3, epoch=1, max_epochs=1)
            for loss in (0.9, 0.8, 0.7):  # within the interval: the first is sent
                progress.show({"loss": loss}, throttle=True)
            progress.show({"val acc": 0.5})  # unthrottled, with the latest loss
    finally:
        progress_reporter(previous)
    assert events.labels("metrics") == ["loss 0.9", "loss 0.7 · val acc 0.5"]


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
