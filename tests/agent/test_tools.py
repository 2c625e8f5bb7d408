import time

import jax
import numpy as np
import pytest
from agent_root import finish, make_root

import jaxnitro as nx
from jaxnitro.agent.tools import AgentTools
from jaxnitro.errors import ConfigError


@pytest.fixture
def tools(tmp_path):
    tools = AgentTools(make_root(tmp_path), max_runs=2)
    yield tools
    tools.shutdown(60)


def wait_for(tools, run_id, done, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = tools.status(run_id)
        if done(status):
            return status
        time.sleep(0.02)
    raise AssertionError(f"run {run_id} never got there: {tools.status(run_id)}")


def test_train_returns_at_once_and_status_follows_the_run(tools):
    nx.compile.cache_reset()  # a cold cache, so the run compiles (and shows it)
    started = tools.train("tiny_agent.py:TinyAgent", keywords={"max_epochs": 2})
    assert (started["run"], started["state"]) == ("r1", "starting")
    status = finish(tools, "r1")
    assert status["state"] == "done"
    assert (status["epoch"], status["stop_reason"], status["phase"]) == (
        2,
        "completed",
        "Done",
    )
    assert any(p.endswith("Compiling") for p in status["phases"])
    assert status["cache"]["misses"] > 0
    assert status["last_metrics"]["epoch"] == 2
    assert status["run_dir"] == str(tools.root / "runs" / "TinyAgent")
    history = tools.history("r1")
    assert [row["epoch"] for row in history["rows"]] == [1, 2]
    assert "train_loss" in history["columns"] and "epoch" in history["text"]
    assert tools.logger("r1") == {
        "path": str(tools.root / "runs" / "TinyAgent" / "metrics.jsonl")
    }
    [summary] = tools.runs("runs/TinyAgent")
    assert summary["epochs"] == [1, 2]


def test_a_client_may_pass_the_step_keywords(tools):
    started = tools.train(
        "tiny_agent.py:TinyAgent", run_dir="steps", keywords={"max_steps": 3}
    )
    status = finish(tools, started["run"])
    assert (status["state"], status["step"], status["stop_reason"]) == (
        "done",
        3,
        "completed",
    )


def test_a_second_train_of_the_same_experiment_hits_the_compile_cache(tools):
    finish(tools, tools.train("tiny_agent.py:TinyAgent", run_dir="a")["run"])
    second = finish(tools, tools.train("tiny_agent.py:TinyAgent", run_dir="b")["run"])
    assert second["cache"]["misses"] == 0
    assert second["cache"]["hits"] >= 2
    assert tools.cache() == nx.cache_stats()


def test_stop_ends_a_training_gracefully_with_a_checkpoint(tools):
    run = tools.train("tiny_agent.py:Slow")["run"]
    wait_for(tools, run, lambda s: s["phase"] == "TrainStepping" and s["step"] > 0)
    assert tools.stop(run)["stopping"] is True
    status = finish(tools, run)
    assert status["stop_reason"] == "requested"
    assert status["epoch"] < 50
    [summary] = tools.runs("runs/Slow")
    assert summary["epochs"][-1] == status["epoch"]
    assert tools.stop(run) == {"run": run, "state": "done", "stopping": False}


def test_a_failed_run_reports_its_error_and_the_server_goes_on(tools):
    status = finish(tools, tools.train("tiny_agent.py:Broken")["run"])
    assert status["state"] == "failed"
    assert "loss exploded on purpose" in status["error"]
    assert "RuntimeError: loss exploded on purpose" in status["traceback"]
    assert finish(tools, tools.train("tiny_agent.py:TinyAgent")["run"])["state"] == (
        "done"
    )


def test_eval_verbs_work_on_a_trained_runs_handle(tools):
    trained = finish(tools, tools.train("tiny_agent.py:TinyAgent")["run"])["run"]
    evaluated = finish(tools, tools.evaluate("test", run=trained)["run"])
    assert set(evaluated["result"]) == {"loss"}
    validated = finish(tools, tools.validate(run=trained)["run"])
    assert validated["result"]["loss"] == pytest.approx(
        tools.history(trained)["rows"][-1]["loss"]
    )
    predicted = finish(tools, tools.predict(run=trained)["run"])["result"]
    assert predicted["batches"] == 2
    assert predicted["outputs"]["output"]["rows"] == 16
    assert predicted["outputs"]["output"]["shape"] == [3]
    one = tools.predict(inputs={"x": [[0.0] * 8]}, run=trained)["run"]
    assert finish(tools, one)["result"]["outputs"]["output"]["rows"] == 1
    exported = finish(tools, tools.export("v1", run=trained)["run"])
    with pytest.raises(ConfigError, match="exists already"):
        tools.export("v1", run=trained)
    assert exported["result"]["path"] == str(tools.root / "export" / "v1")
    bundle = nx.load_bundle(exported["result"]["path"])
    x = np.zeros((1, 8), np.float32)
    assert bundle(x=x)["logits"].shape == (1, 3)


def test_an_eval_verb_can_build_a_new_handle(tools):
    started = tools.evaluate("val", experiment="tiny_agent.py:TinyAgent")
    status = finish(tools, started["run"])
    assert status["state"] == "done" and "loss" in status["result"]


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda t: t.train("../x.py:X"), "outside the server's root"),
        (lambda t: t.train("tiny_agent.py:Nope"), "has no class 'Nope'"),
        (
            lambda t: t.train("tiny_agent.py:TinyAgent", overrides={"width": "x"}),
            "TinyAgent.width is declared int, so it takes a whole number",
        ),
        (
            lambda t: t.train("tiny_agent.py:TinyAgent", overrides={"width": -4}),
            r"TinyAgent.width must be >= 1, got -4: the field declares ge=1\. Pass "
            r"a value in that range, e\.g\. width=1\.",
        ),
        (
            lambda t: t.train("tiny_agent.py:TinyAgent", overrides={"width": 0}),
            "TinyAgent.width must be >= 1, got 0",
        ),
        (
            lambda t: t.train(
                "tiny_agent.py:TinyAgent", keywords={"max_epochs": "abc"}
            ),
            r"max_epochs must be an int, got 'abc' \(from the keyword\)",
        ),
        (
            lambda t: t.train("tiny_agent.py:TinyAgent", keywords={"max_steps": 0}),
            r"max_steps must be >= 1, got 0 \(from the keyword\)",
        ),
        (
            lambda t: t.train("tiny_agent.py:TinyAgent", keywords={"precision": "fp8"}),
            "precision must be one of",
        ),
        (
            lambda t: t.train("tiny_agent.py:TinyAgent", keywords={"seed": 1e30}),
            r"seed=1000000000000000019884624838656 \(from the keyword\) is out of",
        ),
        (
            lambda t: t.train("tiny_agent.py:TinyAgent", keywords=[1]),
            "keywords=\\[1\\] must be an object",
        ),
        (
            lambda t: t.evaluate(
                "test", experiment="tiny_agent.py:TinyAgent", keywords={"accum": 0}
            ),
            r"accum must be >= 1, got 0",
        ),
        (
            lambda t: t.export(
                "v1", batch_sizes=[0], experiment="tiny_agent.py:TinyAgent"
            ),
            r"export batch_sizes=\[0\] must be a non-empty list of integers >= 1",
        ),
        (
            lambda t: t.predict(inputs={"x": [[1.0, 2.0], [3.0]]}, run="r1"),
            r"predict inputs\['x'\] is ragged: its rows do not all have the same "
            r"shape",
        ),
        (
            lambda t: t.predict(inputs={"x": [["a", "b"]]}, run="r1"),
            r"predict inputs\['x'\] must hold numbers",
        ),
        (
            lambda t: t.train("tiny_agent.py:TinyAgent", run_dir="../../out"),
            "outside the server's root",
        ),
        (
            lambda t: t.train("tiny_agent.py:TinyAgent", keywords={"logger": "x"}),
            "run keyword 'logger' is not one a client may pass",
        ),
        (lambda t: t.validate(), "takes either run .* not neither"),
        (lambda t: t.export("v1", dir="/tmp", run="r1"), "outside the server's root"),
        (lambda t: t.runs("/"), "outside the server's root"),
        (lambda t: t.export("../v1", run="r1"), "without a slash"),
        (
            lambda t: t.train("tiny_agent.py:TinyAgent", keywords={"resume": "/x"}),
            "a checkpoint path is not accepted",
        ),
        (lambda t: t.status("r7"), "no run 'r7' on this server"),
        (lambda t: t.predict(inputs={"x": 3}, run="r1"), "must be a list of rows"),
    ],
)
def test_bad_arguments_are_refused_before_any_run_starts(tools, call, match):
    with pytest.raises(ConfigError, match=match):
        call(tools)
    assert tools.registry.all() == []


def test_starts_past_max_runs_are_refused(tools):
    first = tools.train("tiny_agent.py:Slow", run_dir="s1")["run"]
    second = tools.train("tiny_agent.py:Slow", run_dir="s2")["run"]
    with pytest.raises(ConfigError, match="at most 2 at once"):
        tools.train("tiny_agent.py:TinyAgent")
    assert tools.shutdown(60) == []
    for run in (first, second):
        assert tools.status(run)["state"] == "done"


@pytest.mark.needs_devices(2)
def test_setup_is_setup_devices(tools, monkeypatch):
    from mesh_experiments import unpinned

    unpinned(monkeypatch)
    report = tools.setup()
    visible, backend = len(jax.local_devices()), jax.default_backend()  # 4, cpu
    assert (report["backend"], len(report["visible"])) == (backend, visible)
    assert (report["n_devs"], report["pinned"]) == (1, None)
    assert "with no arguments it only reports" in report["note"]
    assert tools.setup(n_devs=2)["pinned"] == nx.setup_devices()["pinned"] == 2
    with pytest.raises(
        nx.ConfigError, match=f"n_devs=8, but only {visible} {backend} device"
    ):
        tools.setup(n_devs=8)


def test_runs_on_a_file_is_refused_with_a_message(tools):
    (tools.root / "notes.txt").write_text("not a run dir")
    with pytest.raises(ConfigError, match=r"runs: run_dir='notes.txt' is a file"):
        tools.runs("notes.txt")
    assert tools.runs("nothing_here") == []


def test_a_verb_on_a_run_checks_its_arguments_against_the_handle(tools):
    trained = finish(tools, tools.train("tiny_agent.py:TinyAgent")["run"])["run"]
    count = len(tools.registry.all())
    refusals = [
        (
            lambda: tools.predict(inputs={"x": [[0.0] * 15]}, run=trained),
            r"predict inputs\['x'\]: each row has shape \(15,\) \(1 rows of 15 "
            r"values\), but the model reads 'x' rows of shape \(8,\) \(float32\)",
        ),
        (
            lambda: tools.predict(inputs={"img": [[0.0] * 8]}, run=trained),
            r"predict inputs\['img'\]: forward reads no field 'img'; it reads 'x'",
        ),
        (
            lambda: tools.predict(inputs={"x": [0.0] * 8}, run=trained),
            r"each row has shape \(\) \(8 rows of scalars\)",
        ),
        (
            lambda: tools.evaluate("tset", run=trained),
            r"evaluate: the handle has no split 'tset'; its splits: test, train, val",
        ),
        (
            lambda: tools.predict("tset", run=trained),
            r"predict: the handle has no split 'tset'",
        ),
        (
            lambda: tools.validate(run=trained, keywords={"max_epochs": 3}),
            r"nitro_validate: run='r1' uses that run's handle as it was built, so "
            r"keywords would have no effect",
        ),
    ]
    for call, match in refusals:
        with pytest.raises(ConfigError, match=match):
            call()
    assert len(tools.registry.all()) == count  # nothing started
    ints = tools.predict(inputs={"x": [[1] * 8]}, run=trained)["run"]
    assert finish(tools, ints)["result"]["outputs"]["output"]["rows"] == 1


def test_predict_inputs_on_a_new_handle_are_checked_in_the_run(tools):
    started = tools.predict(
        inputs={"x": [[0.0] * 15]}, experiment="tiny_agent.py:TinyAgent"
    )
    status = finish(tools, started["run"])
    assert status["state"] == "failed"
    assert (
        "ConfigError: predict inputs['x']: each row has shape (15,)"
        in (status["error"])
    )
