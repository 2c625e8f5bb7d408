"""Progress reporting: the verbs, the default choice, notes, the bar on a terminal."""

from __future__ import annotations

import io
import logging
import os
import re
import select
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import experiments
import pytest
from rich.console import Console

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
from jaxnitro.observe.progress_bar import BarReporter, is_terminal_session
from jaxnitro.observe.progress_line import ProgressLine
from jaxnitro.observe.progress_log import LOGGER_NAME, LogReporter, is_log_shown


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


def test_the_default_shows_nothing_on_a_captured_stream(monkeypatch, progress_logger):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert not is_terminal_session()
    assert not is_log_shown()  # only the last-resort handler, at WARNING
    bar, log = Events(), Events()
    chooser = DefaultReporter(bar=bar, log=log)
    chooser("begin", "train", 1, 1, 1)
    chooser("step", "", 0, 0, 0)
    chooser("done", "", 0, 0, 0)
    assert chooser.choice is None
    assert bar.calls == [] and log.calls == []


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
    bar, log = Events(), Events()
    chooser = DefaultReporter(bar=bar, log=log)
    chooser("begin", "train", 1, 1, 1)
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # mid-stretch: the choice holds
    chooser("step", "", 0, 0, 0)
    assert bar.verbs() == [("begin", "train"), ("step", "")]
    chooser("begin", "val", 1, 1, 1)  # a new stretch chooses again: nothing now
    assert chooser.choice is None
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


# ------------------------------------------------------------- the line, the log ---
def test_the_line_reads_as_a_person_expects_and_fills_by_the_run():
    line = ProgressLine()
    line.begin("setup", 0, 0, 0)
    line.set_phase("building data")
    line.note = "decoding 1200/5000"
    assert line.description() == "setup [building data] (decoding 1200/5000)"
    assert line.fraction is None and line.closing("") == "setup done"
    line.begin("train", 4, 3, 40)  # a resumed run starts at epoch 3
    assert line.description() == "epoch 3/40: train" and line.fraction == 2 / 40
    for _ in range(4):
        line.step()
    assert line.fraction == 3 / 40
    line.begin("val", 2, 3, 40)  # validation holds the run's fraction
    line.step()
    assert line.fraction == 3 / 40
    assert line.closing("") == "done: 3/40 epochs"
    line.begin("test", 4, 0, 0)  # a stretch without epochs fills by its units
    line.step()
    assert line.fraction == 0.25 and line.closing("") == "test done"


def test_the_log_reporter_writes_records_and_throttles_steps_and_notes():
    now = [0.0]
    stream = io.StringIO()
    logger = logging.getLogger("tests.progress.log")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    handler = logging.StreamHandler(stream)
    records: list = []
    handler.addFilter(lambda r: records.append(r) or True)
    logger.addHandler(handler)
    try:
        log = LogReporter(logger, interval_s=5.0, clock=lambda: now[0])
        log("step", "", 0, 0, 0)  # before any begin: ignored
        log("begin", "train", 4, 1, 2)
        log("phase", "compiling gradient", 0, 0, 0)
        log("phase", "", 0, 0, 0)
        log("step", "", 0, 0, 0)  # within the interval: not written
        now[0] = 6.0
        log("step", "", 0, 0, 0)
        log("note", "fast", 0, 0, 0)  # within the interval again
        log("end", "", 0, 0, 0)
        log("done", "", 0, 0, 0)
    finally:
        logger.removeHandler(handler)
    assert stream.getvalue().splitlines() == [
        "  0% epoch 1/2: train",
        "  0% epoch 1/2: train [compiling gradient]",
        "  0% epoch 1/2: train",
        " 25% epoch 1/2: train",
        " 25% done: 1/2 epochs",
    ]
    first, *_, last = (r.progress for r in records)
    assert first["id"] == last["id"] and last["done"] and not first["done"]
    assert last == {**last, "name": "done: 1/2 epochs", "fraction": 0.25}


# ------------------------------------------------------------------- the bar ---
def test_the_bar_draws_nothing_when_stderr_is_no_terminal(monkeypatch):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    bar = BarReporter()
    bar("begin", "train", 1, 1, 1)
    bar("step", "", 0, 0, 0)
    assert not bar.is_live and sys.stderr.getvalue() == ""


def test_the_bar_redraws_at_most_ten_times_a_second_however_many_events():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100, color_system=None)
    bar = BarReporter(console=console, refresh_per_second=10)
    started = time.monotonic()
    bar("begin", "setup", 0, 0, 0)
    bar("phase", "building data", 0, 0, 0)
    for i in range(3000):
        bar("note", f"decoding {i}/3000", 0, 0, 0)
    bar("begin", "train", 3000, 1, 1)
    for _ in range(3000):
        bar("step", "", 0, 0, 0)
    bar("done", "", 0, 0, 0)
    elapsed = time.monotonic() - started
    frames = out.getvalue().count("\x1b[2K")  # rich erases the line to redraw it
    assert frames <= 10 * elapsed + 3, (frames, elapsed)
    assert out.getvalue().split("\x1b[2K")[-1].startswith("done: 1/1 epochs ")
    assert not bar.is_live


# ------------------------------------------------- the bar under a real terminal ---
CHILD = textwrap.dedent(
    """
    import os, sys
    from jaxnitro.observe.progress import Progress, progress_note, with_progress_note

    sync = int(sys.argv[1])

    def checkpoint():  # wait until the parent has seen the screen
        os.read(sync, 1)

    with Progress() as p:  # Nitro(e): setup
        p.begin("setup")
        p.phase("building data")
        checkpoint()
        with with_progress_note("loading index"):
            with with_progress_note("decoding 3/5"):
                checkpoint()
            checkpoint()
            p.phase("building model")
            checkpoint()
    with Progress() as p:  # train()
        for epoch in (1, 2, 3):
            p.begin("train", 4, epoch=epoch, max_epochs=3)
            if epoch == 1:
                p.phase("compiling gradient")
                checkpoint()
                p.phase("")
            for step in range(4):
                p.step()
                if epoch == 2 and step == 1:
                    checkpoint()
            p.begin("val", 2, epoch=epoch, max_epochs=3)
            p.step()
            p.step()
    """
)


class Terminal:
    """A child process on a pseudo-terminal, its output fed to a terminal emulator."""

    def __init__(
        self, script: str, *args: str, columns: int = 100, rows: int = 10
    ) -> None:
        import fcntl
        import pty
        import struct
        import termios

        import pyte

        self.screen = pyte.Screen(columns, rows)
        self._stream = pyte.ByteStream(self.screen)
        self._master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
        sync_read, self._sync = os.pipe()
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("CI", "COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR")
            and not k.startswith(("TTY_", "JUPYTER_"))
        }
        env["TERM"] = "xterm-256color"
        self.process = subprocess.Popen(
            [sys.executable, "-c", script, str(sync_read), *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            pass_fds=(sync_read,),
        )
        os.close(slave)
        os.close(sync_read)

    def lines(self) -> list[str]:
        return [line.rstrip() for line in self.screen.display if line.strip()]

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self._master], [], [], timeout)
        if not ready:
            return True
        try:
            data = os.read(self._master, 65536)
        except OSError:  # the child closed the terminal
            return False
        self._stream.feed(data)
        return bool(data)

    def expect(self, text: str, timeout: float = 10.0) -> list[str]:
        """Read until a screen line contains `text`; the screen's lines."""
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines()):
            if time.monotonic() > deadline or not self._read(0.05):
                raise AssertionError(f"{text!r} never appeared; screen: {self.lines()}")
        return self.lines()

    def proceed(self) -> None:
        os.write(self._sync, b".")

    def finish(self, timeout: float = 10.0) -> list[str]:
        deadline = time.monotonic() + timeout
        while self._read(0.05) and time.monotonic() < deadline:
            if (
                self.process.poll() is not None
                and not select.select([self._master], [], [], 0)[0]
            ):
                break
        assert self.process.wait(timeout=timeout) == 0
        return self.lines()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        os.close(self._master)
        os.close(self._sync)


def described(line: str) -> str:
    """The description part of a bar line: the text before the bar's glyphs."""
    return re.split(r" +[━╸╺]", line, maxsplit=1)[0]


@pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pseudo-terminal")
def test_a_person_at_a_terminal_sees_one_line_per_entry_point():
    pytest.importorskip("pyte")
    term = Terminal(CHILD)
    try:
        (line,) = term.expect("setup [building data]")
        assert described(line) == "setup [building data]"
        term.proceed()
        (line,) = term.expect("(decoding 3/5)")
        assert described(line) == "setup [building data] (decoding 3/5)"
        term.proceed()
        (line,) = term.expect("(loading index)")
        assert described(line) == "setup [building data] (loading index)"
        term.proceed()
        (line,) = term.expect("setup [building model]")
        assert described(line) == "setup [building model]"  # the note was cleared
        term.proceed()
        done, line = term.expect("epoch 1/3: train [compiling gradient]")
        assert described(done) == "setup done" and " 100% " in done
        assert described(line) == "epoch 1/3: train [compiling gradient]"
        assert line.endswith(" 0%")  # no ETA before the first step
        term.proceed()
        _, line = term.expect("epoch 2/3: train")
        assert described(line) == "epoch 2/3: train" and " 50% " in line
        term.proceed()
        screen = term.finish()
    finally:
        term.close()
    assert len(screen) == 2, screen  # no partial or leftover lines
    assert described(screen[0]) == "setup done" and " 100% " in screen[0]
    assert described(screen[1]) == "done: 3/3 epochs" and " 100% " in screen[1]
    assert not term.screen.cursor.hidden  # the bar gave the cursor back


TRAINING = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, sys.argv[2])
    import jaxnitro as nx
    from experiments import Tiny

    sync = int(sys.argv[1])
    holds = {("GradientCompiling", 1), ("EvalStepping", 2)}

    def hold(phase, step, epoch, info):  # wait until the parent has seen the screen
        key = (type(phase).__name__, epoch)
        if key in holds:
            holds.discard(key)
            os.read(sync, 1)

    nx.register_phase_monitor(hold)
    nx.Nitro(Tiny(max_epochs=3), logger=None, checkpointer=None).train()
    """
)


@pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pseudo-terminal")
def test_a_real_training_run_at_a_terminal_keeps_one_live_line():
    pytest.importorskip("pyte")
    term = Terminal(TRAINING, str(Path(experiments.__file__).resolve().parent), rows=40)
    try:
        *_, done, line = term.expect("[compiling gradient]", timeout=60)
        assert described(done) == "setup done" and " 100% " in done
        assert described(line) == "epoch 1/3: train [compiling gradient]"
        term.proceed()
        *_, line = term.expect("epoch 2/3: val", timeout=60)
        assert described(line) == "epoch 2/3: val"
        term.proceed()
        screen = term.finish(timeout=60)
    finally:
        term.close()
    bars = [line for line in screen if re.search(r" +[━╸╺]", line)]
    assert [described(b) for b in bars] == ["setup done", "done: 3/3 epochs"]
    assert screen[-1] == bars[-1] and " 100% " in bars[-1]
    # The setup report printed while the bar was live sits whole above it.
    assert any(x.startswith("╭") and "jaxnitro: Tiny" in x for x in screen), screen
    assert not term.screen.cursor.hidden
