"""Ctrl+C and SIGTERM as a graceful stop: the handlers, and real training processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import experiments
import pytest
from experiments import QuietLogger, Tiny
from handle_parts import parts_of

import jaxnitro as nx
from jaxnitro.observe.interrupt import (
    STOP_MESSAGE,
    TERMINATE_MESSAGE,
    StopOnInterrupt,
)

SUPPORT = Path(experiments.__file__).resolve().parent  # what the process imports


# ----------------------------------------------------------------- the handler ---
def test_the_first_ctrl_c_requests_a_stop_and_says_so(capfd):
    stops: list = []
    with StopOnInterrupt(lambda: stops.append("stop")) as guard:
        assert guard.installed
        signal.raise_signal(signal.SIGINT)  # no KeyboardInterrupt
        assert stops == ["stop"] and guard.requested
    printed = capfd.readouterr().err
    assert STOP_MESSAGE in printed
    assert "stop requested (Ctrl+C)" in printed
    assert "Press Ctrl+C again to interrupt at once" in printed
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_second_ctrl_c_exits_at_once_without_a_traceback(capfd):
    stops: list = []
    with (
        pytest.raises(SystemExit) as exited,
        StopOnInterrupt(lambda: stops.append(1), message=None),
    ):
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)
    assert exited.type is SystemExit and exited.value.code == 130
    assert stops == [1]
    assert (
        "second Ctrl+C during the graceful stop: exiting at once with status 130"
        in (capfd.readouterr().err)
    )
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_second_ctrl_c_at_an_interactive_prompt_interrupts_and_keeps_the_session(
    monkeypatch,
):
    monkeypatch.setattr(sys, "ps1", ">>> ", raising=False)
    with (
        pytest.raises(KeyboardInterrupt),
        StopOnInterrupt(lambda: None, message=None),
    ):
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)


def test_the_first_sigterm_requests_a_preemption_stop_and_says_so(capfd):
    calls: list = []
    with StopOnInterrupt(
        lambda: calls.append("stop"), on_terminate=lambda: calls.append("preempt")
    ) as guard:
        signal.raise_signal(signal.SIGTERM)  # the process is not terminated
        assert calls == ["preempt"] and guard.requested and guard.terminated
    printed = capfd.readouterr().err
    assert TERMINATE_MESSAGE in printed
    assert "SIGTERM received (preemption)" in printed
    assert "exiting with status 143" in printed
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_sigterm_without_on_terminate_calls_request_stop():
    calls: list = []
    with StopOnInterrupt(lambda: calls.append("stop"), terminate_message=None) as g:
        signal.raise_signal(signal.SIGTERM)
    assert calls == ["stop"] and g.terminated


@pytest.mark.parametrize(
    ("first", "second", "status", "name"),
    [
        (signal.SIGTERM, signal.SIGTERM, 143, "SIGTERM"),
        (signal.SIGTERM, signal.SIGINT, 130, "Ctrl+C"),
        (signal.SIGINT, signal.SIGTERM, 143, "SIGTERM"),
    ],
)
def test_a_second_signal_during_the_stop_exits_at_once(
    capfd, first, second, status, name
):
    with (
        pytest.raises(SystemExit) as exited,
        StopOnInterrupt(lambda: None, message=None, terminate_message=None),
    ):
        signal.raise_signal(first)
        signal.raise_signal(second)
    assert exited.value.code == status
    assert f"second {name} during the graceful stop" in capfd.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_an_ignored_sigterm_stays_ignored():
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with StopOnInterrupt(lambda: None) as guard:
            assert guard.installed  # SIGINT still is
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_stop_on_interrupt_refuses_a_non_callable_on_terminate():
    with pytest.raises(
        TypeError,
        match=r"StopOnInterrupt\(on_terminate=\.\.\.\) takes the function to call "
        r"on SIGTERM, or None; got int",
    ):
        StopOnInterrupt(lambda: None, on_terminate=3)  # type: ignore[arg-type]


def test_a_second_ctrl_c_runs_the_previous_handler():
    seen: list = []

    def mine(signum, frame):
        seen.append(signum)

    previous = signal.signal(signal.SIGINT, mine)
    try:
        with StopOnInterrupt(lambda: None, message=None):
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
        assert seen == [signal.SIGINT]
        assert signal.getsignal(signal.SIGINT) is mine
    finally:
        signal.signal(signal.SIGINT, previous)


def test_an_ignored_sigint_stays_ignored_and_nothing_is_installed():
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with StopOnInterrupt(lambda: None) as guard:
            assert not guard.installed
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_off_the_main_thread_nothing_is_installed():
    result: dict = {}

    def run() -> None:
        with StopOnInterrupt(lambda: None) as guard:
            result["installed"] = guard.installed

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    assert result == {"installed": False}
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_nested_block_leaves_ctrl_c_to_the_outer_one():
    stops: list = []
    with (
        pytest.raises(SystemExit),
        StopOnInterrupt(lambda: stops.append("outer"), message=None) as outer,
        StopOnInterrupt(lambda: stops.append("inner"), message=None) as inner,
    ):
        assert outer.installed and not inner.installed
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)  # a second press interrupts at once
    assert stops == ["outer"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_handler_installed_inside_the_block_is_not_overwritten_on_exit():
    def theirs(signum, frame):
        pass

    try:
        with StopOnInterrupt(lambda: None):
            signal.signal(signal.SIGINT, theirs)
        assert signal.getsignal(signal.SIGINT) is theirs
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def test_stop_on_interrupt_refuses_a_non_callable():
    with pytest.raises(
        TypeError,
        match=r"StopOnInterrupt takes the function to call on Ctrl\+C, such as "
        r"nitro\.request_stop; got NoneType",
    ):
        StopOnInterrupt(None)  # type: ignore[arg-type]


# --------------------------------------------------- a preemption in process ---
class TermAtStep(QuietLogger):
    """Sends this process a SIGTERM at one train line, as a scheduler would."""

    def __init__(self, step):
        self.step = step

    def log_metrics(self, metrics, *, step, epoch, context, **kw):
        if context == "train" and step == self.step:
            signal.raise_signal(signal.SIGTERM)


def test_a_sigterm_checkpoints_then_raises_preempted_with_status_143(tmp_path, capfd):
    run_dir = str(tmp_path / "run")
    nitro = nx.Nitro(
        Tiny(n_train=160, max_epochs=50),
        run_dir=run_dir,
        logger=TermAtStep(3),
        log_every_n_steps=1,
    )
    with pytest.raises(nx.Preempted) as exited:
        nitro.train()
    assert not isinstance(exited.value, Exception)  # `except Exception` passes it on
    assert exited.value.code == 143 and exited.value.stop_reason == "preempted"
    step = nitro.current_step
    assert nitro.stop_reason == "preempted" and 3 <= step < 10  # mid-epoch
    message = str(exited.value)
    assert message.startswith(
        f"jaxnitro: preempted (SIGTERM): stopped at epoch 1, step {step};"
    )
    assert f"its checkpoint is written in {run_dir}" in message
    assert 'continue it with Nitro(e, resume="auto")' in message
    assert message in capfd.readouterr().err  # the interpreter exits silently
    [entry] = nx.read_manifest(run_dir)
    assert (entry.step, entry.stop_reason) == (step, "preempted")
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    stops = parts_of(nitro).stops
    assert not stops.stop_requested and not stops.preempted


# ------------------------------------------------------- a real training process ---
TRAIN = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[1])
    import jaxnitro as nx
    from experiments import Tiny

    nitro = nx.Nitro(Tiny(max_epochs=100_000), run_dir="run", logger=nx.JSONLogger())
    nitro.train()
    print("stop_reason", nitro.stop_reason)
    """
)


def _first_train_line(path: Path, process: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"training exited early: {process.communicate()}")
        if path.exists() and '"context": "train"' in path.read_text():
            return
        time.sleep(0.02)
    raise AssertionError(f"no train line in {path} after {timeout} s")


@pytest.mark.needs_processes
@pytest.mark.slow  # a training process of its own
@pytest.mark.skipif(sys.platform == "win32", reason="needs POSIX signals")
def test_ctrl_c_stops_a_training_process_gracefully(tmp_path):
    process = subprocess.Popen(
        [sys.executable, "-c", TRAIN, str(SUPPORT)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "JAXNITRO_COMPILATION_CACHE": "off"},
    )
    try:
        _first_train_line(tmp_path / "run" / "metrics.jsonl", process, timeout=60)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, err
    assert "stop_reason requested" in out
    assert "stop requested (Ctrl+C)" in err

    import jaxnitro as nx

    entries = nx.read_manifest(str(tmp_path / "run"))
    last = max(entries, key=lambda e: (e.written, e.epoch))
    assert last.stop_reason == "requested"
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    finish = json.loads(lines[-1])
    assert (finish["type"], finish["status"]) == ("finish", "requested")
    validated = [json.loads(x) for x in lines if '"context": "validate"' in x]
    assert validated[-1]["epoch"] == last.epoch  # the stopping epoch validated


# ---------------------------------------------------- SIGTERM, a preemption ---
PREEMPTED = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, sys.argv[1])
    import jaxnitro as nx
    from experiments import Tiny

    class SlowFinish(nx.JSONLogger):
        def finish(self, status):
            super().finish(status)
            if sys.argv[2] == "slow":  # a long graceful stop, to interrupt
                open("finishing", "w").close()
                time.sleep(120)

    nitro = nx.Nitro(Tiny(max_epochs=100_000), run_dir="run", logger=SlowFinish())
    try:
        nitro.train()
    finally:
        print("finally ran", nitro.stop_reason, flush=True)
    print("after train", flush=True)
    """
)


def _preempted_process(tmp_path: Path, mode: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", PREEMPTED, str(SUPPORT), mode],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "JAXNITRO_COMPILATION_CACHE": "off"},
    )


@pytest.mark.needs_processes
@pytest.mark.slow  # a training process of its own
@pytest.mark.skipif(sys.platform == "win32", reason="needs POSIX signals")
def test_sigterm_checkpoints_exits_preempted_and_the_run_resumes(tmp_path):
    process = _preempted_process(tmp_path, "fast")
    try:
        _first_train_line(tmp_path / "run" / "metrics.jsonl", process, timeout=60)
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 143, err
    assert "SIGTERM received (preemption)" in err
    assert "jaxnitro: preempted (SIGTERM): stopped at epoch" in err
    assert "its checkpoint is written in run" in err
    assert "Exiting with status 143" in err
    assert "Traceback" not in err
    assert "finally ran preempted" in out and "after train" not in out

    import jaxnitro as nx

    run_dir = str(tmp_path / "run")
    entries = nx.read_manifest(run_dir)
    last = max(entries, key=lambda e: (e.written, e.epoch))
    assert last.stop_reason == "preempted"
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    finish = json.loads(lines[-1])
    assert (finish["type"], finish["status"]) == ("finish", "preempted")
    resumed = nx.Nitro(
        Tiny(max_epochs=last.epoch + 1), run_dir=run_dir, resume="auto", logger=None
    )
    assert (resumed.current_epoch, resumed.current_step) == (last.epoch, last.step)
    resumed.train()
    assert resumed.stop_reason == "completed"
    assert resumed.current_epoch == last.epoch + 1


@pytest.mark.needs_processes
@pytest.mark.slow  # a training process of its own
@pytest.mark.skipif(sys.platform == "win32", reason="needs POSIX signals")
def test_a_second_sigterm_during_the_graceful_stop_exits_at_once(tmp_path):
    process = _preempted_process(tmp_path, "slow")
    try:
        _first_train_line(tmp_path / "run" / "metrics.jsonl", process, timeout=60)
        process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 60
        while not (tmp_path / "finishing").exists():  # inside the graceful stop
            assert time.monotonic() < deadline and process.poll() is None
            time.sleep(0.02)
        sent = time.monotonic()
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 143, err
    assert took < 20  # not the 120 s the stop would have taken
    assert "second SIGTERM during the graceful stop: exiting at once" in err
    assert "Traceback" not in err
    assert "preempted (SIGTERM): stopped at epoch" not in err  # it did not finish
