"""A pass's threads, run by threads that outlive the pass.

Every prefetch pass runs threads of its own (one producer, or the fan-out's workers
and its transfer thread: 9 with the default 8 workers), at every epoch and every
validation. Starting and joining a thread cost a TPU v5e host (a gVisor sandbox)
1.2 ms, against 0.11 ms for a round trip of wake-ups between two waiting threads
(2026-12-07), where the tutorial MLP's whole epoch of 60 steps runs in 3.4 ms; and
a new thread's allocations likely start from cold memory (`loop/host_buffers.py`).
So a pass's thread is a `PassThread`: started, joined and named like a
`threading.Thread`, its work run by a parked thread of this module's pool, which
after the work waits `IDLE_SECONDS` for the next and then ends. A parked thread is
named `jaxnitro-idle`; while it runs a pass's work it carries that work's name.

>>> done = []
>>> thread = PassThread(lambda: done.append(1), name="jaxnitro-example")
>>> thread.start(); thread.join(); done, thread.is_alive()
([1], False)
"""

from __future__ import annotations

import contextvars
import os
import threading
from collections.abc import Callable

IDLE_SECONDS = 30.0
"""How long a parked thread waits for its next work before it ends."""
MOST_PARKED = 32
"""Parked threads kept at most; a thread finishing its work beyond them ends."""
IDLE_NAME = "jaxnitro-idle"

_lock = threading.Lock()
_parked: list[_Parked] = []


class PassThread:
    """One thread's work in a pass: `start()`, `join(timeout)`, `is_alive()` and
    `name` as a `threading.Thread`'s; run by a parked thread (a new one where none
    is parked). The work runs once; an exception it raises ends the thread that ran
    it, reported as a thread's (`threading.excepthook`)."""

    def __init__(self, target: Callable[[], None], name: str) -> None:
        self.name = name
        self._target = target
        self._started = False
        self._done = threading.Event()
        self.thread: threading.Thread | None = None
        """The thread running the work, once it runs."""

    def start(self) -> None:
        if self._started:
            raise RuntimeError(f"PassThread {self.name} started twice")
        self._started = True
        with _lock:
            parked = _parked.pop() if _parked else None
        if parked is not None:
            parked.wake(self)
            return
        try:
            threading.Thread(
                target=_serve, args=(self,), name=self.name, daemon=True
            ).start()
        except BaseException:  # no thread could start (the process's limit)
            self._done.set()  # never to run: not alive, and a join returns
            raise

    def join(self, timeout: float | None = None) -> None:
        """Wait until the work has run, at most `timeout` seconds."""
        self._done.wait(timeout)

    def is_alive(self) -> bool:
        """Started and not yet finished, as `threading.Thread.is_alive`."""
        return self._started and not self._done.is_set()

    def runs_on(self, thread: threading.Thread) -> bool:
        """Whether `thread` is the one running this work."""
        return self.thread is thread

    def _run(self) -> None:
        current = threading.current_thread()
        self.thread = current
        current.name = self.name
        try:
            # In an empty context, as on a new thread: what one work sets in a
            # context variable is not seen by the next.
            contextvars.Context().run(self._target)
        finally:
            current.name = IDLE_NAME
            self._done.set()


class _Parked:
    """A pool thread between two works."""

    def __init__(self) -> None:
        self._woken = threading.Event()
        self._work: PassThread | None = None

    def wake(self, work: PassThread) -> None:
        self._work = work
        self._woken.set()

    def next_work(self) -> PassThread | None:
        """The next work, or None once IDLE_SECONDS passed without one (the thread
        then leaves the pool and ends)."""
        if not self._woken.wait(IDLE_SECONDS):
            with _lock:
                if self in _parked:
                    _parked.remove(self)
                    return None
            self._woken.wait()  # taken meanwhile: its work is being handed over
        work, self._work = self._work, None
        self._woken.clear()
        return work


def _serve(work: PassThread | None) -> None:
    parked = _Parked()
    while work is not None:
        work._run()
        with _lock:
            if len(_parked) >= MOST_PARKED:
                return
            _parked.append(parked)
        work = parked.next_work()


def _forget_parked() -> None:
    """In a forked child: the parent's parked threads do not exist there."""
    global _lock
    _lock = threading.Lock()
    _parked.clear()


os.register_at_fork(after_in_child=_forget_parked)
