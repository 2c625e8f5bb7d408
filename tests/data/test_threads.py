"""A pass's threads run on pooled threads: reused, named, bounded, fork-safe."""

from __future__ import annotations

import contextvars
import os
import subprocess
import sys
import threading

import pytest
from process_jobs import child_env

import jaxnitro.data.threads as threads
from jaxnitro.data.threads import IDLE_NAME, PassThread

WAIT = 10.0


def ran_on() -> tuple[PassThread, list[str]]:
    """A PassThread that records the name it ran under."""
    names: list[str] = []
    work = PassThread(
        lambda: names.append(threading.current_thread().name), name="jaxnitro-t-work"
    )
    return work, names


def test_a_later_pass_thread_runs_on_the_thread_the_first_one_left_parked():
    first, names = ran_on()
    first.start()
    first.join(WAIT)
    assert names == ["jaxnitro-t-work"] and not first.is_alive()
    assert first.thread is not None and first.thread.is_alive()  # parked
    assert first.thread.name == IDLE_NAME
    second, _ = ran_on()
    second.start()
    second.join(WAIT)
    assert second.thread is first.thread


def test_join_waits_for_the_work_and_is_alive_follows_it():
    release = threading.Event()
    work = PassThread(lambda: release.wait(WAIT), name="jaxnitro-t-slow")
    assert not work.is_alive()  # not started
    work.start()
    work.join(0.01)
    assert work.is_alive()
    release.set()
    work.join(WAIT)
    assert not work.is_alive()
    with pytest.raises(RuntimeError, match="started twice"):
        work.start()


def test_a_work_no_thread_could_start_for_is_not_alive(monkeypatch):
    def refuse(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threads, "_parked", [])  # none to wake: a new one is needed
    monkeypatch.setattr(threading.Thread, "start", refuse)
    work, names = ran_on()
    with pytest.raises(RuntimeError, match="can't start new thread"):
        work.start()
    work.join(WAIT)
    assert not work.is_alive() and names == []


def test_each_work_starts_in_an_empty_context_as_on_a_new_thread():
    var: contextvars.ContextVar[str] = contextvars.ContextVar("test_threads_var")
    seen: list[str] = []
    first = PassThread(lambda: var.set("left by the first"), name="jaxnitro-t-set")
    first.start()
    first.join(WAIT)
    second = PassThread(lambda: seen.append(var.get("unset")), name="jaxnitro-t-read")
    second.start()
    second.join(WAIT)
    assert second.thread is first.thread and seen == ["unset"]


@pytest.mark.parametrize(
    "limit", [("IDLE_SECONDS", 0.05), ("MOST_PARKED", 0)], ids=["idle", "full"]
)
def test_a_thread_the_pool_keeps_no_longer_ends_and_is_never_woken(monkeypatch, limit):
    """Idle past IDLE_SECONDS, or finishing its work with MOST_PARKED threads
    parked, a thread ends; a later work runs (a dead thread left in the pool would
    be handed it, and it would never run)."""
    monkeypatch.setattr(threads, *limit)
    work, _ = ran_on()
    work.start()
    work.join(WAIT)
    assert work.thread is not None
    work.thread.join(WAIT)
    assert not work.thread.is_alive()
    later, names = ran_on()
    later.start()
    later.join(WAIT)
    assert names == ["jaxnitro-t-work"]


def test_work_that_raises_is_reported_as_a_threads_and_ends_its_thread(monkeypatch):
    reported = []
    monkeypatch.setattr(threading, "excepthook", reported.append)

    def boom() -> None:
        raise ValueError("in the work")

    work = PassThread(boom, name="jaxnitro-t-boom")
    work.start()
    work.join(WAIT)
    assert work.thread is not None
    work.thread.join(WAIT)
    assert not work.thread.is_alive()
    assert [type(r.exc_value) for r in reported] == [ValueError]
    later, names = ran_on()  # the pool still serves
    later.start()
    later.join(WAIT)
    assert names == ["jaxnitro-t-work"]


FORK_CHILD = """
import os, signal, threading
from jaxnitro.data.threads import PassThread, _parked

def run():
    names = []
    work = PassThread(lambda: names.append(1), name="jaxnitro-t-work")
    work.start()
    work.join(5.0)
    return names

assert run() and _parked  # the parent has a parked thread, which no child has
pid = os.fork()
if pid == 0:  # the child's work must run, not wait for the parent's thread
    signal.alarm(20)  # a hung child ends by itself
    os._exit(0 if run() else 3)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_runs_its_pass_threads_on_threads_of_its_own():
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", FORK_CHILD],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] == "0"
