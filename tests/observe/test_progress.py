"""Progress reporting: the verbs, notes, and the default choice of reporter."""

from __future__ import annotations

import io
import logging
import sys
import warnings

import pytest

from jaxnitro.errors import NitroWarning
from jaxnitro.observe import progress as progress_mod
from jaxnitro.observe.progress import (
    DefaultReporter,
    Progress,
    current_progress_reporter,
    default_progress_reporter,
    progress_note,
    progress_reporter,
    with_progress_note,
)
from jaxnitro.observe.progress_bar import is_terminal_session
from jaxnitro.observe.progress_log import LOGGER_NAME, is_log_shown


class Events:
    """A reporter that records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __call__(self, verb, label, total, epoch, max_epochs) -> None:
        self.calls.append((verb, label, total, epoch, max_epochs))

    def verbs(self) -> list[tuple[str, str]]:
        return [(verb, label) for verb, label, *_ in self.calls]


@pytest.fixture
def events():
    """Install a recording reporter for one test; restore the previous one after."""
    recorder = Events()
    previous = progress_reporter(recorder)
    progress_mod._clear_notes()
    yield recorder
    progress_reporter(previous)
    progress_mod._clear_notes()


# ------------------------------------------------------------------ the verbs ---
def test_the_driver_sends_each_verb_with_the_stretch():
    events = Events()
    previous = progress_reporter(events)
    try:
        with Progress() as progress:
            progress.begin("setup")
            progress.phase("building data")
            progress.end()
        with Progress() as progress:
            progress.begin("train", 2, epoch=1, max_epochs=3)
            progress.phase("compiling gradient")
            progress.phase("")
            progress.step()
            progress.step()
            progress.begin("val", 1, epoch=1, max_epochs=3)  # ends "train" first
            progress.step()
    finally:
        assert progress_reporter(previous) is events
    assert events.calls == [
        ("begin", "setup", 0, 0, 0),
        ("phase", "building data", 0, 0, 0),
        ("end", "setup", 0, 0, 0),
        ("done", "", 0, 0, 0),
        ("begin", "train", 2, 1, 3),
        ("phase", "compiling gradient", 2, 1, 3),
        ("phase", "", 2, 1, 3),
        ("step", "train", 2, 1, 3),
        ("step", "train", 2, 1, 3),
        ("end", "train", 2, 1, 3),
        ("begin", "val", 1, 1, 3),
        ("step", "val", 1, 1, 3),
        ("end", "val", 1, 1, 3),
        ("done", "", 0, 1, 3),
    ]


def test_done_is_sent_once_and_only_by_the_outermost_driver(events):
    with Progress() as outer:
        outer.begin("train", 1, epoch=1, max_epochs=1)
        with Progress() as inner:  # validate() called inside train()
            inner.begin("val", 1)
            inner.done("val done")
        outer.done("stopped early")
        outer.done("again")
    assert [v for v in events.verbs() if v[0] == "done"] == [("done", "stopped early")]


def test_an_exception_closes_the_line_naming_where_it_stopped(events):
    with pytest.raises(FloatingPointError), Progress() as progress:
        progress.begin("train", 4, epoch=2, max_epochs=3)
        raise FloatingPointError("loss is nan")
    with pytest.raises(KeyboardInterrupt), Progress() as progress:
        progress.begin("val", 2)
        raise KeyboardInterrupt
    assert [v for v in events.verbs() if v[0] in ("end", "done")] == [
        ("end", "train"),
        ("done", "failed: epoch 2/3: train"),
        ("end", "val"),
        ("done", "interrupted: val"),
    ]


def test_progress_reporter_returns_the_previous_and_none_switches_off(events):
    assert current_progress_reporter() is events
    assert progress_reporter(None) is events
    with Progress() as progress:
        progress.begin("train", 1)
        progress.step()
    progress_note("unseen")
    assert events.calls == []
    assert progress_reporter(events) is None


def test_progress_reporter_refuses_a_non_callable():
    with pytest.raises(
        TypeError,
        match=r"progress_reporter takes f\(verb, label, total, epoch, max_epochs\) or "
        r"None \(progress off\); got str 'bar'",
    ):
        progress_reporter("bar")  # type: ignore[arg-type]
    assert current_progress_reporter() is default_progress_reporter


def test_a_raising_reporter_is_switched_off_with_one_warning_and_the_run_goes_on():
    calls: list = []

    def flaky(verb, label, total, epoch, max_epochs):
        calls.append(verb)
        if verb == "step":
            raise OSError("terminal went away")

    previous = progress_reporter(flaky)
    try:
        with Progress() as progress:
            progress.begin("train", 3)
            with pytest.warns(
                NitroWarning,
                match=r"Progress reporter .*flaky raised OSError: terminal went away "
                r"on verb 'step'\. It is switched off and the run goes on\. Fix it "
                r"and install it again with progress_reporter\(f\)",
            ):
                progress.step()
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                progress.step()
                progress_note("still fine")
        assert current_progress_reporter() is None
        assert calls == ["begin", "step", "done"]  # the done lets it close a display
    finally:
        progress_reporter(previous)


# ------------------------------------------------------------------- notes ---
def test_notes_nest_the_innermost_shows_and_leaving_restores(events):
    with Progress() as progress:
        progress.begin("setup")
        progress.phase("building data")
        with with_progress_note("loading index"):
            for i in (1, 2):
                with with_progress_note(f"decoding {i}/2"):
                    pass
            progress_note("index 40%")  # replaces the innermost block's note
        progress_note("loose")
        progress_note("loose")  # unchanged: no event
        with pytest.raises(ValueError), with_progress_note("risky"):
            raise ValueError
    notes = [label for verb, label in events.verbs() if verb == "note"]
    assert notes == [
        "loading index",
        "decoding 1/2",
        "loading index",
        "decoding 2/2",
        "loading index",
        "index 40%",
        "",
        "loose",
        "risky",
        "loose",
    ]


def test_a_new_phase_or_stretch_clears_every_note_even_in_open_blocks(events):
    with Progress() as progress:
        progress.begin("setup")
        with with_progress_note("outer"):
            progress.phase("building model")  # clears "outer"
            with with_progress_note("inner"):
                pass  # leaving restores the cleared outer note: ""
            progress_note("set again")
            progress.begin("train", 1)  # clears it too
        progress_note("after")
    assert [v for v in events.verbs() if v[0] in ("note", "phase", "begin")] == [
        ("begin", "setup"),
        ("note", "outer"),
        ("phase", "building model"),
        ("note", "inner"),
        ("note", ""),
        ("note", "set again"),
        ("begin", "train"),
        ("note", "after"),
    ]


# ---------------------------------------------------------- the default choice ---
class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def progress_logger():
    logger = logging.getLogger(LOGGER_NAME)
    level, propagate = logger.level, logger.propagate
    yield logger
    logger.setLevel(level)
    logger.propagate = propagate
    for handler in list(logger.handlers):
        logger.removeHandler(handler)


def test_the_default_writes_epoch_summaries_on_a_captured_stream(
    monkeypatch, progress_logger
):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert not is_terminal_session()
    assert not is_log_shown()  # only the last-resort handler, at WARNING
    bar, log, summary = Events(), Events(), Events()
    chooser = DefaultReporter(bar=bar, log=log, summary=summary)
    chooser("begin", "train", 1, 1, 1)
    chooser("step", "", 0, 0, 0)
    chooser("epoch", "epoch 1/1: train_loss 0.5 · 0.1 s", 0, 1, 1)
    chooser("done", "", 0, 0, 0)
    assert chooser.choice is None
    assert bar.calls == [] and log.calls == []
    assert ("epoch", "epoch 1/1: train_loss 0.5 · 0.1 s") in summary.verbs()


def test_the_default_logs_when_a_handler_shows_info(monkeypatch, progress_logger):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    stream = io.StringIO()
    progress_logger.addHandler(logging.StreamHandler(stream))
    progress_logger.setLevel(logging.INFO)
    assert is_log_shown()
    bar, log = Events(), Events()
    chooser = DefaultReporter(bar=bar, log=log)
    chooser("begin", "train", 1, 1, 1)
    chooser("step", "", 0, 0, 0)
    chooser("done", "", 0, 0, 0)
    assert chooser.choice is None  # chosen again at the next stretch
    assert log.verbs() == [("begin", "train"), ("step", ""), ("done", "")]
    assert bar.calls == []


def test_the_default_draws_the_bar_on_a_terminal_and_holds_it_for_the_stretch(
    monkeypatch,
):
    monkeypatch.setattr(sys, "stderr", FakeTTY())
    monkeypatch.setenv("TERM", "xterm")
    assert is_terminal_session()
    bar, log, summary = Events(), Events(), Events()
    chooser = DefaultReporter(bar=bar, log=log, summary=summary)
    chooser("begin", "train", 1, 1, 1)
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # mid-stretch: the choice holds
    chooser("step", "", 0, 0, 0)
    assert bar.verbs() == [("begin", "train"), ("step", "")]
    chooser("begin", "val", 1, 1, 1)  # a new stretch chooses again: the summary
    assert chooser.choice is summary
    assert bar.verbs()[-1] == ("done", "")  # its line was closed before switching


def test_a_dumb_terminal_gets_no_bar(monkeypatch):
    monkeypatch.setattr(sys, "stderr", FakeTTY())
    monkeypatch.setenv("TERM", "dumb")
    assert not is_terminal_session()


def test_is_log_shown_follows_levels_and_propagation(progress_logger):
    progress_logger.setLevel(logging.INFO)
    progress_logger.propagate = False
    assert not is_log_shown()  # enabled, but no handler
    loud = logging.StreamHandler(io.StringIO())
    loud.setLevel(logging.WARNING)
    progress_logger.addHandler(loud)
    assert not is_log_shown()  # the handler drops INFO
    loud.setLevel(logging.INFO)
    assert is_log_shown()
    progress_logger.setLevel(logging.WARNING)
    assert not is_log_shown()


# ------------------------------------------------------- several steps at once ---
def test_steps_sends_one_step_a_unit_to_a_reporter_without_advance(events):
    with Progress() as progress:
        progress.begin("train", 10, epoch=1, max_epochs=2)
        progress.steps(3)
        progress.steps(0)
    assert [v for v, _ in events.verbs()] == [
        "begin",
        "step",
        "step",
        "step",
        "end",
        "done",
    ]


class Advancing(Events):
    """A reporter that takes several steps in one call."""

    def __init__(self) -> None:
        super().__init__()
        self.advanced: list[int] = []

    def advance(self, count: int) -> None:
        self.advanced.append(count)


def test_steps_sends_one_advance_to_a_reporter_that_has_it():
    reporter = Advancing()
    previous = progress_reporter(reporter)
    try:
        with Progress() as progress:
            progress.begin("train", 10, epoch=1, max_epochs=2)
            progress.steps(4)
            progress.step()
    finally:
        progress_reporter(previous)
    assert reporter.advanced == [4]
    assert [v for v, _ in reporter.verbs()] == ["begin", "step", "end", "done"]


def test_an_advance_that_raises_switches_the_reporter_off_with_a_warning():
    class Broken(Advancing):
        def advance(self, count: int) -> None:
            raise RuntimeError("no room")

    reporter = Broken()
    previous = progress_reporter(reporter)
    try:
        with Progress() as progress:
            progress.begin("train", 10)
            with pytest.warns(
                NitroWarning, match="raised RuntimeError: no room on verb 'step'"
            ):
                progress.steps(2)
            assert current_progress_reporter() is None
    finally:
        progress_reporter(previous)


def test_the_default_reporter_advances_its_choice_as_many_steps_would():
    out = io.StringIO()
    summary = progress_mod.SummaryReporter(stream=out, interval_s=None)
    chosen = DefaultReporter(bar=summary, log=summary, summary=summary)
    chosen("begin", "train", 10, 1, 2)
    chosen.advance(3)
    chosen("step", "", 0, 0, 0)
    assert summary.progress_text(0.0).startswith("epoch 1/2: train 4/10")
    plain = Events()
    fallback = DefaultReporter(bar=plain, log=plain, summary=plain)
    fallback("begin", "train", 10, 1, 2)
    fallback.advance(2)
    assert [v for v, _ in plain.verbs()] == ["begin", "step", "step"]
