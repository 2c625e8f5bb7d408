"""The phases a real run publishes, as a monitor sees them."""

from experiments import Tiny

import jaxnitro as nx


def quiet(**kw):
    return {"logger": None, "checkpointer": None, **kw}


def names(events):
    return [type(phase).__name__ for phase, *_ in events]


def test_a_whole_run_publishes_its_phases_in_order():
    nx.cache_reset()  # compile phases appear only when something compiles
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
    before = nx.progress_counter()
    nitro = nx.Nitro(Tiny(max_epochs=1), **quiet())
    nitro.train()  # 4 optimizer steps and 2 val batches
    assert nx.progress_counter() - before == 6
    nitro.evaluate(split="test")  # 3 batches
    assert nx.progress_counter() - before == 9


def test_phase_is_starting_until_the_first_transition_and_keeps_how_a_run_ended():
    nitro = nx.Nitro(Tiny(max_epochs=1), **quiet())
    assert isinstance(nitro.phase, nx.Starting)
    nitro.train()
    assert isinstance(nitro.phase, nx.Done)
    assert not nx.work_in_flight()


def test_a_stop_request_ends_with_the_call_that_honoured_it():
    nitro = nx.Nitro(Tiny(max_epochs=3), **quiet())
    nitro.request_stop()  # made while idle: the next run honours it
    nitro.train()
    assert nitro.stop_reason == "requested" and nitro.current_epoch == 1
    assert set(nitro.validate()) == {"loss"}  # not cut short by a stale request
