"""Phase monitors: module-level and per-handle registration, the order they fire in,
threads, raising monitors and what registration refuses.

These run against a small fake handle (tests/support/monitor_fakes.py).
"""

from __future__ import annotations

import threading
import warnings

import pytest
from monitor_fakes import FakeHandle, Recorder, names

from jaxnitro.errors import NitroWarning
from jaxnitro.observe import phases
from jaxnitro.observe.entry import entry_point
from jaxnitro.observe.monitors import (
    MonitorHandle,
    register_phase_monitor,
    unregister_phase_monitor,
)
from jaxnitro.observe.transitions import publish_phase, set_phase


# ------------------------------------------------------------------ registration ---
def test_module_level_monitors_fire_in_registration_order_then_the_handles_own():
    events: list = []
    nitro = FakeHandle()
    register_phase_monitor(Recorder(events, "own-1"), nitro=nitro)
    register_phase_monitor(Recorder(events, "module-1"))
    register_phase_monitor(Recorder(events, "module-2"))
    register_phase_monitor(Recorder(events, "own-2"), nitro=nitro)
    with entry_point(nitro):
        set_phase(nitro, phases.TrainStepping())
    assert names(events) == [
        ("module-1", "Starting"),
        ("module-2", "Starting"),
        ("own-1", "Starting"),
        ("own-2", "Starting"),
        ("module-1", "TrainStepping"),
        ("module-2", "TrainStepping"),
        ("own-1", "TrainStepping"),
        ("own-2", "TrainStepping"),
        ("module-1", "Idle"),
        ("module-2", "Idle"),
        ("own-1", "Idle"),
        ("own-2", "Idle"),
    ]


def test_a_per_handle_monitor_takes_effect_at_once_and_only_on_its_handle():
    events: list = []
    nitro, other = FakeHandle(), FakeHandle()
    register_phase_monitor(Recorder(events, "own"), nitro=nitro)
    set_phase(nitro, phases.EvalStepping())
    set_phase(other, phases.EvalStepping())
    assert names(events) == [("own", "EvalStepping")]


def test_a_module_level_monitor_reaches_a_built_handle_at_its_next_entry_point():
    events: list = []
    nitro = FakeHandle()
    register_phase_monitor(Recorder(events, "late"))
    set_phase(nitro, phases.TrainStepping())  # not copied yet: no entry point since
    assert events == []
    with entry_point(nitro):
        set_phase(nitro, phases.EvalStepping())
    with entry_point(nitro):  # a second entry copies nothing twice
        set_phase(nitro, phases.Done())
    assert names(events) == [
        ("late", "Starting"),
        ("late", "EvalStepping"),
        ("late", "Idle"),
        ("late", "Starting"),
        ("late", "Done"),
        ("late", "Idle"),
    ]


def test_unregistering_a_module_level_monitor_leaves_handles_that_copied_it():
    events: list = []
    copied, fresh = FakeHandle(), FakeHandle()
    handle = register_phase_monitor(Recorder(events, "m"))
    with entry_point(copied):
        pass
    unregister_phase_monitor(handle)
    unregister_phase_monitor(handle)  # twice is a no-op
    events.clear()
    set_phase(copied, phases.TrainStepping())
    with entry_point(fresh):
        set_phase(fresh, phases.TrainStepping())
    assert names(events) == [("m", "TrainStepping")]
    assert all(info.nitro is copied for *_, info in events)


def test_unregistering_a_per_handle_monitor_removes_it_and_twice_is_a_no_op():
    events: list = []
    nitro = FakeHandle()
    handle = register_phase_monitor(Recorder(events, "own"), nitro=nitro)
    assert isinstance(handle, MonitorHandle)
    assert "per-handle" in repr(handle)
    unregister_phase_monitor(handle)
    unregister_phase_monitor(handle)
    set_phase(nitro, phases.TrainStepping())
    assert events == []
    assert nitro.phase_recorder.monitors.monitors() == ()


def test_register_accepts_the_recorder_itself_as_nitro():
    events: list = []
    nitro = FakeHandle()
    register_phase_monitor(Recorder(events, "r"), nitro=nitro.phase_recorder)
    set_phase(nitro.phase_recorder, phases.Done())
    assert names(events) == [("r", "Done")]


def test_registering_from_another_thread_while_a_run_publishes_is_safe():
    nitro = FakeHandle()
    counts = {"calls": 0}
    stop = threading.Event()

    def count(phase, step, epoch, info):
        counts["calls"] += 1

    def register_many():
        handles = [register_phase_monitor(count, nitro=nitro) for _ in range(200)]
        for handle in handles[::2]:
            unregister_phase_monitor(handle)
        stop.set()

    worker = threading.Thread(target=register_many)
    worker.start()
    cycle = (phases.TrainStepping(), phases.EvalStepping())
    i = 0
    while not stop.is_set() or i < 10:
        set_phase(nitro, cycle[i % 2])
        i += 1
    worker.join()
    assert len(nitro.phase_recorder.monitors.monitors()) == 100
    before = counts["calls"]
    set_phase(nitro, cycle[i % 2])
    assert counts["calls"] - before == 100


# ------------------------------------------------------------- raising monitors ---
def test_a_raising_monitor_is_warned_about_once_and_the_run_goes_on():
    events: list = []
    nitro = FakeHandle()

    def broken(phase, step, epoch, info):
        raise RuntimeError("heartbeat socket closed")

    register_phase_monitor(broken)
    register_phase_monitor(Recorder(events, "after"))
    with (
        pytest.warns(
            NitroWarning,
            match=r"Phase monitor .*broken raised RuntimeError: heartbeat socket "
            r"closed on Starting\(\)\. The run goes on .* unregister_phase_monitor",
        ),
        entry_point(nitro),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("error")  # no second warning from it
        set_phase(nitro, phases.TrainStepping())
        set_phase(nitro, phases.Done())
    assert names(events) == [
        ("after", "Starting"),
        ("after", "TrainStepping"),
        ("after", "Done"),
        ("after", "Idle"),
    ]


def test_a_monitor_and_its_copies_share_one_warning():
    def broken(phase, step, epoch, info):
        raise ValueError("nope")

    register_phase_monitor(broken)
    with pytest.warns(NitroWarning, match="broken raised ValueError") as record:
        publish_phase(phases.Starting())  # the module-level registry
        a, b = FakeHandle(), FakeHandle()
        with entry_point(a):
            pass
        with entry_point(b):
            pass
    assert len(record) == 1


# -------------------------------------------------------- registration errors ---
def test_register_refuses_what_cannot_be_a_monitor():
    with pytest.raises(
        TypeError,
        match=r"A phase monitor must be callable as f\(phase, step, epoch, info\); "
        r"got int 3",
    ):
        register_phase_monitor(3)  # type: ignore[arg-type]

    def two(phase, step):
        pass

    with pytest.raises(
        TypeError,
        match=r"Phase monitor .*two has the signature \(phase, step\), which cannot "
        r"be called with the four arguments \(phase, step, epoch, info\)",
    ):
        register_phase_monitor(two)  # type: ignore[arg-type]
    register_phase_monitor(print)  # *args builtins pass


def test_register_names_the_python_argument_order_and_refuses_a_non_handle():
    nitro = FakeHandle()
    with pytest.raises(
        TypeError,
        match=r"register_phase_monitor takes the monitor first: write "
        r"register_phase_monitor\(f, nitro=nitro\)",
    ):
        register_phase_monitor(nitro, lambda p, s, e, i: None)  # type: ignore[arg-type]
    with pytest.raises(
        TypeError,
        match=r"nitro= must be a Nitro \(or its phase_recorder\); got str, which has "
        r"no phase monitors",
    ):
        register_phase_monitor(lambda p, s, e, i: None, nitro="run")


def test_unregister_refuses_a_function():
    with pytest.raises(
        TypeError,
        match=r"unregister_phase_monitor takes the handle register_phase_monitor "
        r"returned, not a function: keep h = register_phase_monitor\(f\) and pass h",
    ):
        unregister_phase_monitor(lambda p, s, e, i: None)  # type: ignore[arg-type]
