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
import jaxnitro.loop.calls as calls
from jaxnitro.observe import progress as progress_module
from jaxnitro.observe import progress_summary
from jaxnitro.observe.progress import Progress, progress_reporter
from jaxnitro.observe.progress_bar import BarReporter
from jaxnitro.observe.progress_line import ProgressLine
from jaxnitro.observe.progress_log import LogReporter
from jaxnitro.observe.progress_summary import SummaryReporter


class Events:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def __call__(self, verb, label, total, epoch, max_epochs) -> None:
        self.calls.append((verb, label))

    def labels(self, verb: str) -> list[str]:
        return [label for v, label in self.calls if v == verb]


def quiet(**kw):
    return {"logger": None, "checkpointer": None, **kw}


EPOCH_LINE = r"epoch (\d)/2: train_loss (\S+) · val acc (\S+) · (\d+\.\d) s"


def test_a_run_off_a_terminal_writes_the_binding_report_and_each_epoch(monkeypatch):
    stderr = io.StringIO()  # a log file: no terminal, no logging handler
    monkeypatch.setattr(sys, "stderr", stderr)
    nitro = nx.Nitro(TinyMetrics(max_epochs=2), **quiet())
    nitro.train()
    text = stderr.getvalue()
    # The binding report first (a log file keeps where every value came from),
    report, _, rest = text.partition("\n" + "epoch 1/2:")
    assert report.startswith("jaxnitro binding report for TinyMetrics\n")
    assert report == nitro.binding_report()
    # then one line per epoch: the epochs are shorter than the 30 s interval.
    lines = ("epoch 1/2:" + rest).splitlines()
    assert len(lines) == 2
    for line, row in zip(lines, nitro.history, strict=True):
        match = re.fullmatch(EPOCH_LINE, line)
        assert match is not None, line
        epoch, loss, acc, _ = match.groups()
        assert int(epoch) == row["epoch"]
        assert float(loss) == pytest.approx(row["train_loss"], rel=1e-3)
        assert float(acc) == pytest.approx(row["acc"], rel=1e-3)
        assert "." in acc  # a ratio never reads as an integer: 1.0, not 1


def test_a_logging_handler_gets_the_binding_report_instead_of_stderr(monkeypatch):
    stderr, records = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    handler = logging.StreamHandler(records)
    handler.setLevel(logging.INFO)
    logger = logging.getLogger("jaxnitro")
    level = logger.level
    logger.setLevel(logging.INFO)  # setLevel: the logger's level cache is reset
    logger.addHandler(handler)
    try:
        nitro = nx.Nitro(TinyMetrics(max_epochs=1), **quiet())
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert "binding report" not in stderr.getvalue()
    assert nitro.binding_report() in records.getvalue()


def test_a_long_epoch_off_a_terminal_writes_a_progress_line_each_interval():
    out, now = io.StringIO(), [100.0]
    reporter = SummaryReporter(stream=out, interval_s=30, clock=lambda: now[0])
    reporter("begin", "train", 1000, 1, 4)
    now[0] = 160.0  # a minute on: a phase event past the interval writes a line
    reporter("phase", "compiling gradient", 1000, 1, 4)
    assert out.getvalue() == "epoch 1/4: train 0/1000 [compiling gradient]\n"
    reporter("phase", "", 1000, 1, 4)
    for i in range(1, 601):  # 10 steps a second from here
        now[0] = 160.0 + i / 10
        reporter("step", "", 1000, 1, 4)
        if i == 5:
            reporter("metrics", "loss 2.439", 1000, 1, 4)
    reporter("epoch", "epoch 1/4: train_loss 1.5 · 100.0 s", 0, 1, 4)
    lines = out.getvalue().splitlines()[1:]
    # One line per 30 s since the line before it: at steps 300 and 600, each with
    # the units done of the epoch's, the latest values, the rate and the run's ETA.
    assert lines == [
        "epoch 1/4: train 300/1000 · loss 2.439 · 10.0 steps/s · ETA 6:10",
        "epoch 1/4: train 600/1000 · loss 2.439 · 10.0 steps/s · ETA 5:40",
        "epoch 1/4: train_loss 1.5 · 100.0 s",
    ]
    # An epoch line restarts the interval: 20 s later, nothing yet.
    reporter("begin", "train", 1000, 2, 4)
    now[0] += 20
    reporter("step", "", 1000, 2, 4)
    assert len(out.getvalue().splitlines()) == 4


def test_the_progress_interval_is_configurable_and_checked():
    assert progress_summary.PROGRESS_EVERY_S == 30.0
    reporter = nx.progress_summary_reporter
    assert reporter.interval_s == 30.0
    out, now = io.StringIO(), [0.0]
    quiet_one = SummaryReporter(stream=out, interval_s=None, clock=lambda: now[0])
    quiet_one("begin", "train", 10, 1, 1)
    for _ in range(10):
        now[0] += 3600.0
        quiet_one("step", "", 10, 1, 1)
    assert out.getvalue() == ""  # None: the epoch lines only
    quiet_one.interval_s = 60
    assert quiet_one.interval_s == 60.0
    for bad in (0, -1.0, float("nan"), float("inf"), True, "30"):
        with pytest.raises(nx.ConfigError, match=r"interval_s must be a number of "):
            SummaryReporter(interval_s=bad)
        with pytest.raises(nx.ConfigError, match=re.escape(f"got {bad!r}")):
            reporter.interval_s = bad
    assert reporter.interval_s == 30.0  # a refused value changes nothing


def test_a_real_run_off_a_terminal_writes_progress_lines_between_epochs(monkeypatch):
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    monkeypatch.setattr(nx.progress_summary_reporter, "_interval", 1e-9)
    # The loop reads a loss back for the line every BAR_SECONDS: at every call here,
    # so the lines of a few fast steps (their programs compiled by an earlier test)
    # show one; one step a call (an accelerator's default "auto" would run epoch
    # 2's 4 steps in one call: one line, with no rate window).
    monkeypatch.setattr(calls, "BAR_SECONDS", 0.0)
    nitro = nx.Nitro(TinyMetrics(max_epochs=2), **quiet(steps_per_call=1))
    nitro.train()
    lines = stderr.getvalue().split(nitro.binding_report() + "\n")[1].splitlines()
    progress = [line for line in lines if not re.fullmatch(EPOCH_LINE, line)]
    assert len(lines) - len(progress) == 2
    train = [line for line in progress if re.match(r"epoch \d/2: train \d", line)]
    assert train, lines
    for line in train:  # the epoch, units done of the total, phase, loss, rate, ETA
        # (a phase such as [compiling gradient] shows when this test compiles the
        # step itself, i.e. when no earlier test in the process did)
        shown = r"epoch [12]/2: train [0-4]/4( \[[a-z ]+\])?( · loss \S+)?"
        shown += r"( · val acc \S+)?"
        shown += r"( · \S+ steps/s)?( · ETA \d+:\d\d)?"
        assert re.fullmatch(shown, line), line
    assert any(" · loss " in line and "steps/s" in line for line in train), train
    assert any("ETA" in line for line in train), train


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
    bar("done", "", 0, 0, 0)


def test_at_a_terminal_each_epoch_line_stays_above_the_bar():
    pyte = pytest.importorskip("pyte")
    from rich.console import Console

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=90, color_system=None)
    bar = BarReporter(console=console, refresh_per_second=1000)
    summaries = [
        "epoch 1/3: train_loss 2.439 · val acc 0.5 · 0.2 s",
        "epoch 2/3: train_loss 1.2 · val acc 1.0 · 0.1 s",
        "epoch 3/3: train_loss 0.9 · val acc 1.0 · 0.1 s",
    ]
    for epoch, summary in enumerate(summaries, 1):
        bar("begin", "train", 2, epoch, 3)
        bar("step", "", 0, 0, 0)
        bar("step", "", 0, 0, 0)
        bar("begin", "val", 1, epoch, 3)
        bar("step", "", 0, 0, 0)
        bar("epoch", summary, 0, epoch, 3)
    bar("done", "", 0, 0, 0)
    screen = pyte.Screen(90, 10)
    pyte.Stream(screen).feed(out.getvalue().replace("\n", "\r\n"))
    shown = [line.rstrip() for line in screen.display if line.strip()]
    # Every epoch's results, then the bar's closing line: nothing was overwritten.
    assert shown[:3] == summaries
    assert len(shown) == 4 and shown[3].startswith("done: 3/3 epochs ")
    assert " 100% " in shown[3]


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
