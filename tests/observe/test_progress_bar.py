"""The progress bar: nothing off a terminal, at most ten redraws a second, and one
live line on a real pseudo-terminal read back through a terminal emulator.
"""

from __future__ import annotations

import io
import os
import re
import select
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import experiments
import pytest
from rich.console import Console

from jaxnitro.observe.progress_bar import BarReporter


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


@pytest.mark.needs_processes
@pytest.mark.slow  # a process on a pseudo-terminal
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


@pytest.mark.needs_processes
@pytest.mark.slow  # a process on a pseudo-terminal
@pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pseudo-terminal")
def test_a_real_training_run_at_a_terminal_keeps_one_live_line_and_its_epochs():
    pytest.importorskip("pyte")
    term = Terminal(TRAINING, str(Path(experiments.__file__).resolve().parent), rows=40)
    try:
        *_, done, line = term.expect("[compiling gradient]", timeout=60)
        assert described(done) == "setup done" and " 100% " in done
        assert described(line) == "epoch 1/3: train [compiling gradient]"
        term.proceed()
        *_, line = term.expect("epoch 2/3: val", timeout=60)
        # The latest train loss, and the monitored metric of epoch 1's validation.
        shown = r"epoch 2/3: val · loss \S+ · val loss \S+"
        assert re.fullmatch(shown, described(line))
        term.proceed()
        screen = term.finish(timeout=60)
    finally:
        term.close()
    bars = [line for line in screen if re.search(r" +[━╸╺]", line)]
    assert [described(b) for b in bars] == ["setup done", "done: 3/3 epochs"]
    assert screen[-1] == bars[-1] and " 100% " in bars[-1]
    # Each epoch's results stay on screen above the bar, in order, just above it.
    epochs = [line for line in screen if line.startswith("epoch ")]
    assert screen[-4:-1] == epochs, screen
    for n, line in enumerate(epochs, 1):
        shown = rf"epoch {n}/3: train_loss \S+ · val loss \S+ · \d+\.\d s"
        assert re.fullmatch(shown, line), line
    # The setup report printed while the bar was live sits whole above it.
    assert any(x.startswith("╭") and "jaxnitro: Tiny" in x for x in screen), screen
    assert not term.screen.cursor.hidden
