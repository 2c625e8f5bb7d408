"""The phases a real run publishes, as a monitor sees them."""

import numpy as np
import pytest
from experiments import Tiny
from handle_parts import parts_of
from monitor_fakes import Recorder

import jaxnitro as nx
from jaxnitro.errors import NitroError
from jaxnitro.observe import phases
from jaxnitro.observe.monitors import register_phase_monitor, unregister_phase_monitor


def quiet(**kw):
    return {"logger": None, "checkpointer": None, **kw}


def names(events):
    return [type(phase).__name__ for phase, *_ in events]


def test_a_whole_run_publishes_its_phases_in_order():
    nx.compile.cache_reset()  # compile phases appear only when something compiles
    events = []
    handle = nx.register_phase_monitor(
        lambda phase, step, epoch, info: events.append((phase, step, epoch, dict(info)))
    )
    try:
        nitro = nx.Nitro(Tiny(max_epochs=2, width=12), **quiet())
        setup = names(events)
        events.clear()
        nitro.train()
    finally:
        nx.unregister_phase_monitor(handle)
    assert setup == ["Starting", "Idle"]
    seen = names(events)
    assert seen[0] == "Starting" and seen[-1] == "Idle"
    assert seen[1:4] == ["TrainStepping", "GradientCompiling", "TrainStepping"]
    assert "EvalCompiling" in seen and seen.index("EvalCompiling") > 3
    assert seen[-2] == "Done"
    # The transition out of EvalStepping back to training carries the metrics.
    back = [
        info
        for (phase, _, _, info), before in zip(events[1:], seen, strict=False)
        if before == "EvalStepping" and isinstance(phase, nx.TrainStepping)
    ]
    assert len(back) == 2 and all("loss" in i["metrics"] for i in back)
    assert seen.count("EvalStepping") >= 2
    # step and epoch are reported once training has begun.
    done = events[-2]
    assert (done[1], done[2]) == (8, 2) and done[3]["nitro"] is nitro
    # A second run compiles nothing: no compile phase at all.
    events.clear()
    again = nx.Nitro(Tiny(max_epochs=1, width=12), **quiet())
    nx.register_phase_monitor(
        lambda phase, step, epoch, info: events.append(
            (phase, step, epoch, dict(info))
        ),
        nitro=again,
    )
    again.train()
    assert "TrainStepping" in names(events)
    assert not any(isinstance(p, nx.Compiling) for p, *_ in events)


def test_progress_counter_counts_steps_and_eval_batches():
    before = nx.observe.progress_counter()
    nitro = nx.Nitro(Tiny(max_epochs=1), **quiet())
    nitro.train()  # 4 optimizer steps and 2 val batches
    assert nx.observe.progress_counter() - before == 6
    nitro.evaluate(split="test")  # 3 batches
    assert nx.observe.progress_counter() - before == 9


def test_phase_is_starting_until_the_first_transition_and_keeps_how_a_run_ended():
    nitro = nx.Nitro(Tiny(max_epochs=1), **quiet())
    assert isinstance(nitro.phase, nx.Starting)
    nitro.train()
    assert isinstance(nitro.phase, nx.Done)
    assert not nx.observe.work_in_flight()


def test_a_stop_request_ends_with_the_call_that_honoured_it():
    nitro = nx.Nitro(Tiny(max_epochs=3), **quiet())
    nitro.request_stop()  # made while idle: the next run honours it
    nitro.train()
    assert nitro.stop_reason == "requested" and nitro.current_epoch == 1
    assert set(nitro.validate()) == {"loss"}  # not cut short by a stale request


def test_a_predict_between_leaves_a_pending_stop_request_for_the_next_run():
    nitro = nx.Nitro(Tiny(max_epochs=3), **quiet())
    nitro.request_stop()  # made while idle
    assert nitro.predict({"x": np.ones((2, 8), np.float32)}).shape == (2, 3)
    assert parts_of(nitro).stops.stop_requested  # predict does not stop: still pending
    nitro.train()
    assert nitro.stop_reason == "requested" and nitro.current_epoch == 1
    assert not parts_of(nitro).stops.stop_requested


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


def test_monitors_see_checkpointing_while_a_record_is_written(tmp_path, monkeypatch):
    # The spec's phase for writing a checkpoint: published around each record, at
    # an epoch's end and inside one, and left for the phase the run came from.
    from jaxnitro.checkpoint.checkpointer import Checkpointer

    events, during = [], []
    save = Checkpointer.save

    def watched_save(self, **kw):
        during.append(type(nitro.phase).__name__)  # the handle's phase meanwhile
        return save(self, **kw)

    monkeypatch.setattr(Checkpointer, "save", watched_save)
    nitro = nx.Nitro(
        Tiny(max_epochs=2),
        logger=None,
        run_dir=str(tmp_path),
        checkpointer=nx.Checkpointer(keep=nx.Last(1)),
        checkpoint_every_n_steps=2,
    )
    nx.register_phase_monitor(
        lambda phase, step, epoch, info: events.append((type(phase).__name__, step)),
        nitro=nitro,
    )
    nitro.train()
    seen = [name for name, _ in events]
    # Steps 2 and 6 inside the epochs, 4 and 8 at their ends (after validation).
    assert during == ["Checkpointing"] * 4
    assert [step for name, step in events if name == "Checkpointing"] == [2, 4, 6, 8]
    for at in (i for i, name in enumerate(seen) if name == "Checkpointing"):
        assert seen[at - 1] == "TrainStepping"
        assert seen[at + 1] == "TrainStepping"  # training goes on
    assert seen[-3:] == ["TrainStepping", "Done", "Idle"]
    assert isinstance(phases.Checkpointing(), phases.Phase)
    assert not isinstance(phases.Checkpointing(), phases.Stepping | phases.Terminal)


def test_a_failed_record_write_leaves_checkpointing_for_failed(tmp_path, monkeypatch):
    from jaxnitro.checkpoint.checkpointer import Checkpointer

    def full_disk(self, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Checkpointer, "save", full_disk)
    events = []
    nitro = nx.Nitro(Tiny(max_epochs=1), logger=None, run_dir=str(tmp_path))
    nx.register_phase_monitor(
        lambda phase, step, epoch, info: events.append(type(phase).__name__),
        nitro=nitro,
    )
    with pytest.raises(OSError, match="No space left"):
        nitro.train()
    assert events[-4:] == ["TrainStepping", "Checkpointing", "Failed", "Idle"]
    assert isinstance(nitro.phase, nx.Failed)
