"""Phase monitors, transitions, the entry-point depth counter and the progress counter.

These run against a small fake handle: all the machinery needs from a Nitro is
`current_step`, `current_epoch`, `logger` and a `phase_recorder`.
"""

from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest

from jaxnitro.errors import NitroError, NitroWarning
from jaxnitro.observe import phases
from jaxnitro.observe.counter import advance_progress_counter, progress_counter
from jaxnitro.observe.entry import entry_point, work_in_flight
from jaxnitro.observe.monitors import (
    MonitorHandle,
    PhaseInfo,
    module_registry,
    register_phase_monitor,
    unregister_phase_monitor,
)
from jaxnitro.observe.transitions import (
    PhaseRecorder,
    publish_phase,
    recorder_of,
    set_phase,
)


class FakeHandle:
    """What the monitors need from a Nitro."""

    def __init__(self, logger: object = "the-logger") -> None:
        self.current_step = 0
        self.current_epoch = 0
        self.logger = logger
        self.phase_recorder = PhaseRecorder(self)


class Recorder:
    """A monitor that records (name, phase, step, epoch, info) for each event."""

    def __init__(self, events: list, name: str) -> None:
        self.events = events
        self.name = name

    def __call__(self, phase, step, epoch, info) -> None:
        self.events.append((self.name, phase, step, epoch, info))


@pytest.fixture(autouse=True)
def _clean_module_registry():
    before = set(module_registry().own())
    yield
    for handle in module_registry().own():
        if handle not in before:
            unregister_phase_monitor(handle)


def names(events: list) -> list[tuple[str, str]]:
    return [(name, type(phase).__name__) for name, phase, *_ in events]


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


# ------------------------------------------------------------------- transitions ---
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


# --------------------------------------------------------------- depth counter ---
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


# ------------------------------------------------------- counters and phases ---
def test_the_progress_counter_is_monotonic_and_refuses_negative_units():
    before = progress_counter()
    advance_progress_counter()
    advance_progress_counter(3)
    advance_progress_counter(0)
    assert progress_counter() - before == 4
    with pytest.raises(
        NitroError,
        match=r"advance_progress_counter\(units=-1\): the progress counter is "
        r"monotonic, so units must be >= 0",
    ):
        advance_progress_counter(-1)
    assert progress_counter() - before == 4


def test_the_progress_counter_counts_across_threads():
    before = progress_counter()
    workers = [
        threading.Thread(
            target=lambda: [advance_progress_counter() for _ in range(500)]
        )
        for _ in range(4)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert progress_counter() - before == 2000


def test_the_phase_tree_and_compile_phases():
    for phase in (
        phases.GradientCompiling(),
        phases.OptimizerCompiling(),
        phases.EvalCompiling(),
        phases.ExportCompiling(),
    ):
        assert isinstance(phase, phases.Compiling)
    assert isinstance(phases.Done(), phases.Terminal)
    assert isinstance(phases.Failed(), phases.Terminal)
    assert isinstance(phases.TrainStepping(), phases.Stepping)
    assert isinstance(phases.EvalStepping(), phases.Stepping)
    assert phases.Done() == phases.Done() and phases.Done() != phases.Failed()
    assert phases.compile_phase("optimizer") == phases.OptimizerCompiling()
    assert phases.compile_phase("eval_loss") == phases.EvalCompiling()
    assert phases.compile_phase("train_step").label == "compiling gradient"
    assert [
        p.label for p in (phases.OptimizerCompiling(), phases.ExportCompiling())
    ] == [
        "compiling optimizer",
        "compiling export",
    ]
    assert set(phases.COMPILE_PHASES) >= {"gradient", "optimizer", "export"}
    with pytest.raises(
        NitroError,
        match=r"No compile phase for program kind 'predict': the known kinds are "
        r"eval_forward, .*Add the kind to COMPILE_PHASES",
    ):
        phases.compile_phase("predict")


# ------------------------------------------------------------------- a real handle ---
def test_a_standalone_validate_then_evaluate_carry_metrics_and_keep_done():
    from experiments import Tiny

    import jaxnitro as nx

    nitro = nx.Nitro(Tiny(max_epochs=1), logger=None, checkpointer=None)
    nitro.train()
    events: list = []
    handle = register_phase_monitor(Recorder(events, "m"), nitro=nitro)
    val = nitro.validate()
    test = nitro.evaluate("test")
    # The events hold the handle and its registry the events: break the cycle, so
    # the handle's arrays go now (a later test counts live arrays).
    unregister_phase_monitor(handle)
    seen = [
        (type(phase).__name__, info.get("metrics")) for _, phase, _, _, info in events
    ]
    # The run ended: Done is not announced again (a monitor closing on a Terminal
    # phase fires once); the metrics ride on the transition out of EvalStepping,
    # which is the entry point's Idle.
    assert [name for name, _ in seen if name != "EvalCompiling"] == [
        *("Starting", "EvalStepping", "Idle"),
        *("Starting", "EvalStepping", "Idle"),
    ]
    assert [metrics for name, metrics in seen if name == "Idle"] == [val, test]
    assert nitro.phase == phases.Done()  # how its run ended, once Idle again


def test_a_failed_evaluation_restores_the_phase(tmp_path):
    from experiments import Tiny

    import jaxnitro as nx

    class Breaks(Tiny):
        def metrics(self, logits, *, y):
            raise ValueError("metrics broke")

    nitro = nx.Nitro(Breaks(max_epochs=1), logger=None, checkpointer=None)
    with pytest.raises(ValueError, match="metrics broke"):
        nitro.validate()
    assert nitro.phase == phases.Starting()  # never trained, and nothing in flight
    with pytest.raises(TypeError):  # fails while it compiles: x is too narrow
        nitro.predict({"x": np.zeros((2, 1), np.float32)})
    assert nitro.phase == phases.Starting()


def test_the_train_function_announces_idle_once():
    from experiments import Tiny

    import jaxnitro as nx

    events: list = []
    handle = register_phase_monitor(Recorder(events, "m"))
    try:
        nx.train(Tiny(max_epochs=1), logger=None, checkpointer=None)
    finally:
        unregister_phase_monitor(handle)
    names = [type(phase).__name__ for _, phase, _, _, _ in events]
    assert names.count("Idle") == 1 and names[-1] == "Idle"
    assert names.count("Starting") == 1
