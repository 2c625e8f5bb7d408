"""Phase transitions: set_phase records and publishes, publish_phase only publishes,
what the info carries, and a recorder holds its handle weakly.
"""

from __future__ import annotations

import pytest
from monitor_fakes import FakeHandle, Recorder, names

from jaxnitro.observe import phases
from jaxnitro.observe.monitors import PhaseInfo, register_phase_monitor
from jaxnitro.observe.transitions import publish_phase, recorder_of, set_phase


def test_set_phase_records_and_publishes_and_a_repeat_is_a_no_op():
    events: list = []
    nitro = FakeHandle()
    register_phase_monitor(Recorder(events, "m"), nitro=nitro)
    assert nitro.phase_recorder.phase == phases.Starting()  # a new handle's phase
    assert set_phase(nitro, phases.TrainStepping()) is True
    assert set_phase(nitro, phases.TrainStepping()) is False
    assert nitro.phase_recorder.phase == phases.TrainStepping()
    assert names(events) == [("m", "TrainStepping")]


def test_publish_phase_publishes_without_recording():
    events: list = []
    nitro = FakeHandle()
    set_phase(nitro, phases.Done())
    register_phase_monitor(Recorder(events, "m"), nitro=nitro)
    publish_phase(phases.Idle(), nitro)
    publish_phase(phases.Idle(), nitro)  # no repeat guard: nothing is stored
    assert names(events) == [("m", "Idle"), ("m", "Idle")]
    assert nitro.phase_recorder.phase == phases.Done()


def test_step_and_epoch_are_none_until_the_first_epoch_and_info_carries_the_handle():
    events: list = []
    nitro = FakeHandle(logger="lg")
    register_phase_monitor(Recorder(events, "m"), nitro=nitro)
    set_phase(nitro, phases.EvalStepping())
    nitro.current_step, nitro.current_epoch = 12, 3
    set_phase(nitro, phases.TrainStepping(), metrics={"loss": 0.25})
    (_, _, step0, epoch0, info0), (_, _, step1, epoch1, info1) = events
    assert (step0, epoch0) == (None, None)
    assert (step1, epoch1) == (12, 3)
    assert info1.nitro is nitro and info1.logger == "lg" and info1.is_rank0 is True
    assert info1["metrics"] == {"loss": 0.25} and "metrics" not in info0
    assert dict(info0) == {"nitro": nitro, "logger": "lg", "is_rank0": True}


def test_module_level_publish_has_no_handle_step_or_epoch():
    events: list = []
    register_phase_monitor(Recorder(events, "m"))
    publish_phase(phases.Starting(), note="building")
    ((_, phase, step, epoch, info),) = events
    assert (phase, step, epoch) == (phases.Starting(), None, None)
    assert info.nitro is None and info.logger is None and info.note == "building"


def test_phase_info_is_read_only_and_names_what_it_carries():
    info = PhaseInfo(logger="lg")
    assert info.get("metrics") is None and len(info) == 3
    assert "logger='lg'" in repr(info)
    with pytest.raises(
        AttributeError,
        match=r"PhaseInfo has no `metrics`: this transition carries nitro, logger, "
        r"is_rank0\. `metrics` comes only with the transition out of EvalStepping; "
        r"read optional keys with info\.get\('metrics'\)",
    ):
        _ = info.metrics
    with pytest.raises(AttributeError, match=r"PhaseInfo is read-only: cannot set"):
        info.logger = "other"


def test_set_phase_refuses_a_class_and_reserved_info_keys():
    nitro = FakeHandle()
    with pytest.raises(
        TypeError,
        match=r"set_phase takes a phase instance such as TrainStepping\(\); got "
        r"<class .*TrainStepping'>\. Instantiate the class: "
        r"set_phase\(\.\.\., TrainStepping\(\)\)",
    ):
        set_phase(nitro, phases.TrainStepping)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"publish_phase takes a phase instance"):
        publish_phase("Idle")  # type: ignore[arg-type]
    with pytest.raises(
        TypeError,
        match=r"Phase info key `logger` is reserved: the framework fills nitro, "
        r"logger, is_rank0 itself",
    ):
        set_phase(nitro, phases.Done(), logger="mine")


def test_recorder_of_refuses_a_non_handle():
    with pytest.raises(
        TypeError, match=r"Expected a Nitro or a PhaseRecorder; got int, which has no"
    ):
        recorder_of(3)


def test_a_recorder_does_not_keep_its_handle_alive():
    import gc
    import weakref

    nitro = FakeHandle()
    recorder = nitro.phase_recorder
    ref = weakref.ref(nitro)
    del nitro
    gc.collect()
    assert ref() is None
    step, epoch, info = recorder.context()
    assert (step, epoch, info.nitro) == (None, None, None)
