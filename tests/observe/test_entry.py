"""The entry-point depth counter: Idle once per outermost entry point, with or without
a handle, on return and on a raise.
"""

from __future__ import annotations

import pytest
from monitor_fakes import FakeHandle, Recorder, names

from jaxnitro.observe import phases
from jaxnitro.observe.entry import entry_point, work_in_flight
from jaxnitro.observe.monitors import register_phase_monitor
from jaxnitro.observe.transitions import set_phase


def test_idle_is_published_once_per_outermost_entry_point():
    events: list = []
    nitro = FakeHandle()
    seen_in_flight: list = []

    def watch(phase, step, epoch, info):
        events.append(("w", phase, step, epoch, info))
        seen_in_flight.append(work_in_flight())

    register_phase_monitor(watch)
    assert not work_in_flight()
    with entry_point(nitro):  # train()
        set_phase(nitro, phases.TrainStepping())
        with entry_point(nitro):  # validate() inside it
            set_phase(nitro, phases.EvalStepping())
        set_phase(nitro, phases.Done())
    assert names(events) == [
        ("w", "Starting"),
        ("w", "TrainStepping"),
        ("w", "EvalStepping"),
        ("w", "Done"),
        ("w", "Idle"),
    ]
    assert seen_in_flight == [True, True, True, True, False]
    assert nitro.phase_recorder.phase == phases.Done()  # Idle is never recorded
    assert not work_in_flight()


def test_an_entry_point_without_a_handle_yet_starts_module_level_and_ends_on_it():
    events: list = []
    register_phase_monitor(Recorder(events, "m"))
    with entry_point() as entry:  # Nitro(e): no handle while setup runs
        assert entry.outermost and entry.recorder is None
        nitro = FakeHandle()
        entry.attach(nitro)
    starting, idle = events
    assert (starting[1], starting[4].nitro) == (phases.Starting(), None)
    assert (idle[1], idle[4].nitro) == (phases.Idle(), nitro)


def test_a_nested_attach_names_the_handle_for_the_outer_entry_point():
    events: list = []
    register_phase_monitor(Recorder(events, "m"))
    with entry_point() as outer:  # jaxnitro.train(e) sugar
        nitro = FakeHandle()
        with entry_point(nitro) as inner:  # Nitro(e) inside it
            assert not inner.outermost
        assert outer.recorder is nitro.phase_recorder
    assert [(type(p).__name__, i.nitro) for _, p, _, _, i in events] == [
        ("Starting", None),
        ("Idle", nitro),
    ]


def test_an_entry_point_that_raises_before_it_has_a_handle_publishes_no_idle():
    events: list = []
    register_phase_monitor(Recorder(events, "m"))
    with pytest.raises(KeyError), entry_point():
        raise KeyError("build_data failed")
    assert names(events) == [("m", "Starting")]
    assert not work_in_flight()


def test_an_entry_point_that_raises_with_a_handle_still_publishes_idle():
    events: list = []
    nitro = FakeHandle()
    register_phase_monitor(Recorder(events, "m"), nitro=nitro)
    with pytest.raises(RuntimeError), entry_point(nitro):
        set_phase(nitro, phases.Failed())
        raise RuntimeError("diverged")
    assert names(events) == [("m", "Starting"), ("m", "Failed"), ("m", "Idle")]


def test_an_entry_point_with_no_handle_that_returns_publishes_module_level_idle():
    events: list = []
    register_phase_monitor(Recorder(events, "m"))
    with entry_point():
        pass
    assert names(events) == [("m", "Starting"), ("m", "Idle")]
