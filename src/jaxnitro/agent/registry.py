"""Background runs: each verb an agent starts runs on a thread of its own.

A `RunRegistry` holds every run the server started, finished or not, by id. A run
builds its `Nitro` (or takes the handle of an earlier run), then does its work (train,
validate, evaluate, predict or export) on its thread; JAX releases the GIL while a
compiled program runs, so the server keeps answering. A run that raises keeps its
error and traceback text for `nitro_status`; nothing a run does reaches the server's
own thread. At most `max_active` runs are active at once; a further start is refused
with the reason. `shutdown` asks every active run to stop (a training still validates
and checkpoints the epoch it was in) and joins them with a bounded wait.

    >>> registry = RunRegistry(max_active=1)
    >>> run = registry.start("noop", "none", build=lambda run: None, work=lambda run: 7)
    >>> run.join(5.0)
    >>> run.state, run.result
    ('done', 7)
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..compile.cache import cache_stats
from ..errors import ConfigError
from ..observe.monitors import (
    MonitorHandle,
    register_phase_monitor,
    unregister_phase_monitor,
)

ACTIVE = ("starting", "running")

TOO_MANY = (
    "{verb} refused: {active} runs are active ({ids}) and the server allows at most "
    "{limit} at once. Wait for one to finish (nitro_status), stop one (nitro_stop), "
    "or start the server with a larger --max-runs."
)


@dataclass
class BackgroundRun:
    """One verb running (or run) on its own thread.

    Attributes:
        id: the run's id, "r1", "r2", ... in start order.
        verb: what it does: "train", "validate", "evaluate", "predict", "export".
        target: what it runs on, for display (the experiment name or a run id).
        state: "starting" (building the handle), "running", "done", "failed".
        handle: the `Nitro` once built (None before, or when setup failed).
        phases: the phase classes the handle published, in order, repeats dropped.
        result: what the work returned (metrics, a path, a summary), once done.
        error: "ErrorClass: message" when the run raised.
        traceback: the traceback text when the run raised.
        stop_requested: whether nitro_stop or shutdown asked it to stop.
    """

    id: str
    verb: str
    target: str
    state: str = "starting"
    handle: Any = None
    phases: list[str] = field(default_factory=list)
    result: Any = None
    error: str | None = None
    traceback: str | None = None
    stop_requested: bool = False
    started: float = field(default_factory=time.time)
    finished: float | None = None
    cache_at_start: dict[str, int] = field(default_factory=cache_stats)
    thread: threading.Thread | None = field(default=None, repr=False)
    monitor: MonitorHandle | None = field(default=None, repr=False)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def active(self) -> bool:
        """Whether the run has not finished yet."""
        return self.state in ACTIVE

    def join(self, timeout: float | None = None) -> None:
        """Wait up to `timeout` seconds for the run's thread to end."""
        if self.thread is not None:
            self.thread.join(timeout)

    def request_stop(self) -> None:
        """Ask the run to stop at its next step boundary (or before it starts)."""
        with self.lock:
            self.stop_requested = True
            handle = self.handle
        if handle is not None:
            handle.request_stop()

    def adopt(self, handle: Any, *, fresh: bool) -> None:
        """Hold `handle`, record its phases, and pass on a stop asked for already.

        `fresh`: the handle was built for this run, so its current phase (Starting)
        is this run's first; a reused handle's is how an earlier run ended.
        """
        self.monitor = register_phase_monitor(self._record_phase, handle)
        if fresh:
            self._record_phase(handle.phase)
        with self.lock:
            self.handle = handle
            self.state = "running"
            stop = self.stop_requested
        if stop:
            handle.request_stop()

    def _record_phase(self, phase: Any, *_: Any) -> None:
        name = type(phase).__name__
        if not self.phases or self.phases[-1] != name:
            self.phases.append(name)


class RunRegistry:
    """The server's background runs, by id, with a limit on how many are active.

    Args:
        max_active: how many runs may be active at once (>= 1).
    """

    def __init__(self, max_active: int = 2) -> None:
        if isinstance(max_active, bool) or not isinstance(max_active, int):
            raise ConfigError(
                f"max_active must be an int >= 1, got {max_active!r}. Pass how many "
                f"runs may be active at once, such as 2."
            )
        if max_active < 1:
            raise ConfigError(
                f"max_active must be >= 1, got {max_active}. Pass how many runs may "
                f"be active at once, such as 2."
            )
        self.max_active = max_active
        self._runs: dict[str, BackgroundRun] = {}
        self._lock = threading.Lock()
        self._closed = False

    def start(
        self,
        verb: str,
        target: str,
        *,
        build: Callable[[BackgroundRun], Any],
        work: Callable[[BackgroundRun], Any],
        uses: Any = None,
    ) -> BackgroundRun:
        """Start `work` on a new thread and return its run at once.

        Args:
            verb: what the run does, for status.
            target: what it runs on, for status.
            build: returns the run's handle (called on the run's thread; setup may
                take a while); None for work without a handle.
            work: does the run's work given the run; what it returns is `result`.
            uses: a handle an earlier run built, which this run works on: refused
                while another active run uses it.

        Raises:
            ConfigError: the server is shutting down, `max_active` runs are
                active, or `uses` is busy in another run.
        """
        with self._lock:
            if self._closed:
                raise ConfigError(
                    f"{verb} refused: the server is shutting down and starts no runs."
                )
            active = [r for r in self._runs.values() if r.active]
            if len(active) >= self.max_active:
                raise ConfigError(
                    TOO_MANY.format(
                        verb=verb,
                        active=len(active),
                        ids=", ".join(r.id for r in active),
                        limit=self.max_active,
                    )
                )
            busy = [r.id for r in active if uses is not None and r.handle is uses]
            if busy:
                raise ConfigError(
                    f"{verb} refused: the handle of {target} is in use by run "
                    f"{busy[0]}, which is still active. Wait for it to finish or stop "
                    f"it with nitro_stop."
                )
            run = BackgroundRun(id=f"r{len(self._runs) + 1}", verb=verb, target=target)
            if uses is not None:
                run.handle = uses
            self._runs[run.id] = run
        run.thread = threading.Thread(
            target=self._execute,
            args=(run, build, work),
            name=f"jaxnitro-agent-{run.id}",
            daemon=True,
        )
        run.thread.start()
        return run

    def get(self, run_id: str) -> BackgroundRun:
        """The run with id `run_id`.

        Raises:
            ConfigError: no run has that id (the known ids are listed).
        """
        with self._lock:
            run = self._runs.get(run_id)
            known = list(self._runs)
        if run is None:
            raise ConfigError(
                f"no run {run_id!r} on this server. Its runs: "
                f"{', '.join(known) or 'none yet'}. Start one with nitro_train."
            )
        return run

    def all(self) -> list[BackgroundRun]:
        """Every run, in start order."""
        with self._lock:
            return list(self._runs.values())

    def shutdown(self, timeout: float = 60.0) -> list[str]:
        """Refuse new runs, ask every active run to stop, wait up to `timeout` s.

        Returns:
            The ids of the runs still active when the wait ended.
        """
        with self._lock:
            self._closed = True
            active = [r for r in self._runs.values() if r.active]
        for run in active:
            run.request_stop()
        deadline = time.monotonic() + timeout
        for run in active:
            run.join(max(0.0, deadline - time.monotonic()))
        return [r.id for r in active if r.active]

    def _execute(
        self,
        run: BackgroundRun,
        build: Callable[[BackgroundRun], Any],
        work: Callable[[BackgroundRun], Any],
    ) -> None:
        try:
            fresh = run.handle is None
            handle = build(run) if fresh else run.handle
            if handle is not None:
                run.adopt(handle, fresh=fresh)
            else:
                run.state = "running"
            run.result = work(run)
            run.state = "done"
        except BaseException as error:  # noqa: BLE001 - a run's failure is its own
            run.error = f"{type(error).__name__}: {error}"
            run.traceback = traceback.format_exc()
            run.state = "failed"
        finally:
            run.finished = time.time()
            if run.monitor is not None:
                unregister_phase_monitor(run.monitor)
