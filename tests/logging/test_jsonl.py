"""The JSON-lines default logger, and what a run logs through it."""

import json
import os
import signal
import subprocess
import sys
import time

import experiments
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
from experiments import QuietLogger, Tiny, TinyTrainAcc

import jaxnitro as nx
from jaxnitro.logging.deferred import DeferredMetrics, resolve_all
from jaxnitro.logging.protocol import log_deferred
from jaxnitro.loop import epoch_log


def read_lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f.read().splitlines()]


def test_default_logger_writes_runs_exp_metrics_jsonl():
    nitro = nx.Nitro(Tiny(max_epochs=2), checkpointer=None, log_every_n_steps=1)
    path = os.path.join("runs", "Tiny", "metrics.jsonl")
    assert nitro.run_dir == os.path.join("runs", "Tiny")
    assert nitro.logger_info == nx.logger_info(nitro) == {"path": path}
    nitro.train()
    lines = read_lines(path)
    assert lines[0]["type"] == "params"
    params = lines[0]
    assert (params["width"], params["smoothing"], params["seed"]) == (16, 0.0, 42)
    assert (params["accum"], params["max_epochs"]) == (1, 2)
    # the resolved prefetch settings (a list of batches: one producer, nothing to
    # spread)
    assert params["prefetch_path"] == "materialized"
    assert params["prefetch_workers"] == 1 and params["prefetch_ordered"] is True
    assert lines[1]["type"] == "other" and lines[1]["key"] == "binding_report"
    assert "max_epochs" in lines[1]["value"] and "from field" in lines[1]["value"]
    train = [x for x in lines if x.get("context") == "train"]
    assert [(x["epoch"], x["step"]) for x in train] == [
        (1, 1),
        (1, 2),
        (1, 3),
        (1, 4),
        (2, 5),
        (2, 6),
        (2, 7),
        (2, 8),
    ]
    validate = [x for x in lines if x.get("context") == "validate"]
    assert [(x["epoch"], x["step"]) for x in validate] == [(1, 4), (2, 8)]
    assert validate[-1]["loss"] == pytest.approx(nitro.history[-1]["loss"])
    run_id = nitro.prepared.run_id
    assert {x["run_id"] for x in lines} == {run_id}  # every line names its run
    assert lines[-1] == {"type": "finish", "run_id": run_id, "status": "completed"}


def test_the_default_writes_a_train_line_every_50_steps(tmp_path):
    # 13 epochs of 4 steps: one train line, at step 50; every epoch's lines stay.
    nitro = nx.Nitro(Tiny(max_epochs=13), run_dir=str(tmp_path), checkpointer=None)
    assert nitro.config.log_every_n_steps == 50
    assert nitro.config.sources["log_every_n_steps"] == "default"
    nitro.train()
    lines = read_lines(tmp_path / "metrics.jsonl")
    train = [x for x in lines if x.get("context") == "train"]
    assert [(x["epoch"], x["step"]) for x in train] == [(13, 50)]
    assert len([x for x in lines if x.get("context") == "validate"]) == 13
    assert len([x for x in lines if x.get("context") == "data"]) == 13
    # Only the writing is thinned: the history is the unlogged run's, bit for bit.
    unlogged = nx.Nitro(Tiny(max_epochs=13), logger=None, checkpointer=None)
    unlogged.train()
    assert [r["train_loss"] for r in nitro.history] == [
        r["train_loss"] for r in unlogged.history
    ]


def test_a_resumed_run_writes_a_resume_line_where_it_continues(tmp_path):
    first = nx.Nitro(Tiny(max_epochs=1), run_dir=str(tmp_path), log_every_n_steps=1)
    first.train()
    again = nx.Nitro(
        Tiny(max_epochs=2), run_dir=str(tmp_path), resume="auto", log_every_n_steps=1
    )
    again.train()
    lines = read_lines(tmp_path / "metrics.jsonl")
    (at,) = [i for i, x in enumerate(lines) if x["type"] == "resume"]
    run_id = first.prepared.run_id
    (record,) = [e for e in nx.read_manifest(str(tmp_path)) if e.epoch == 1]
    assert lines[at] == {
        "type": "resume",
        "run_id": run_id,
        "step": 4,
        "epoch": 1,
        "source": os.path.join(str(tmp_path), record.file),
    }
    assert {x["run_id"] for x in lines} == {run_id}  # the same run continues
    after = [x["step"] for x in lines[at:] if x.get("context") == "train"]
    assert after == [5, 6, 7, 8]


def test_log_every_n_steps_thins_only_the_train_lines(tmp_path):
    nx.Nitro(
        Tiny(max_epochs=2),
        run_dir=str(tmp_path),
        log_every_n_steps=3,
        checkpointer=None,
    ).train()
    lines = read_lines(tmp_path / "metrics.jsonl")
    assert [x["step"] for x in lines if x.get("context") == "train"] == [3, 6]
    assert len([x for x in lines if x.get("context") == "validate"]) == 2


def step_losses(lines, key="loss"):
    """{step: value of `key`} of the train lines of a run logged every step."""
    return {x["step"]: x[key] for x in lines if x.get("context") == "train"}


def assert_the_steps_mean(value, per_step):
    """`value` is the mean of the steps' values (and not the last step's alone)."""
    mean = np.mean(per_step)
    assert value == pytest.approx(mean, rel=1e-6)
    assert per_step[-1] != pytest.approx(mean, rel=1e-6)  # the test tells them apart


def test_every_epoch_ends_with_a_train_summary_line_whatever_the_cadence(tmp_path):
    # 4 steps an epoch, under the default 50: no train line, but every epoch's
    # summary line carries its mean loss and its train_metrics' means.
    nitro = nx.Nitro(TinyTrainAcc(max_epochs=2), run_dir=str(tmp_path / "thin"))
    assert nitro.config.log_every_n_steps == 50
    nitro.train()
    twin = nx.Nitro(
        TinyTrainAcc(max_epochs=2),
        run_dir=str(tmp_path / "every"),
        log_every_n_steps=1,
        checkpointer=None,
    )
    twin.train()
    lines = read_lines(tmp_path / "thin" / "metrics.jsonl")
    assert [x for x in lines if x.get("context") == "train"] == []
    summary = [x for x in lines if x.get("context") == "train_epoch"]
    assert [(x["type"], x["epoch"], x["step"]) for x in summary] == [
        ("metrics", 1, 4),
        ("metrics", 2, 8),
    ]
    every = read_lines(tmp_path / "every" / "metrics.jsonl")
    per_step = step_losses(every)
    accs = step_losses(every, "train_acc")
    for x, first in zip(summary, (1, 5), strict=True):
        steps = range(first, first + 4)
        assert_the_steps_mean(x["loss"], [per_step[s] for s in steps])
        # the mean of the train_acc the steps' train lines carry
        assert_the_steps_mean(x["train_acc"], [accs[s] for s in steps])
        assert set(x) == {*METRIC_KEYS, "loss", "train_acc"}
    # the summary's loss is the history's train_loss, exactly
    assert [x["loss"] for x in summary] == [r["train_loss"] for r in nitro.history]
    # the twin logs every step, and one summary an epoch as well
    assert [x["step"] for x in every if x.get("context") == "train_epoch"] == [4, 8]


METRIC_KEYS = ("type", "run_id", "context", "epoch", "step")


@pytest.mark.parametrize(
    ("steps_per_call", "accum", "n_devs", "fold_every"),
    [
        (1, 1, 1, 64),
        (3, 1, 1, 64),  # calls of 3, 3 and a tail of 1: its padding rows unread
        (3, 1, 1, 2),  # folded into the device sum mid-epoch
        (3, 2, 1, 64),  # each step's last micro-batch, as its train line
        (1, 2, 1, 2),
        pytest.param(  # on a mesh, the calls folded every 2
            1, 1, 2, 2, marks=pytest.mark.needs_devices(2)
        ),
        pytest.param(1, 2, 2, 64, marks=pytest.mark.needs_devices(2)),
    ],
)
def test_the_summary_averages_each_train_metric_over_the_epochs_steps(
    tmp_path, monkeypatch, steps_per_call, accum, n_devs, fold_every
):
    monkeypatch.setattr(epoch_log, "FOLD_EVERY", fold_every)
    kw = {"steps_per_call": steps_per_call, "accum": accum, "n_devs": n_devs}
    n_train = 16 * 7 * accum  # 7 optimizer steps an epoch

    def run(name, **more):
        nx.Nitro(
            TinyTrainAcc(max_epochs=2, n_train=n_train),
            run_dir=str(tmp_path / name),
            checkpointer=None,
            **kw,
            **more,
        ).train()
        return read_lines(tmp_path / name / "metrics.jsonl")

    thin = run("thin")
    every = run("every", log_every_n_steps=1)  # the twin: a line every step
    accs = step_losses(every, "train_acc")
    assert sorted(accs) == list(range(1, 15))
    for lines in (thin, every):
        summary = [x for x in lines if x.get("context") == "train_epoch"]
        assert [(x["epoch"], x["step"]) for x in summary] == [(1, 7), (2, 14)]
        for x, first in zip(summary, (1, 8), strict=True):
            steps = range(first, first + 7)
            assert_the_steps_mean(x["train_acc"], [accs[s] for s in steps])


@pytest.mark.parametrize("steps_per_call", [1, 3])
def test_the_summary_averages_host_train_metrics_over_the_epochs_steps(
    tmp_path, steps_per_call
):
    # 6 micro-batches under accum=2: a step's train line carries its last
    # micro-batch's count (2, 4, 6), the summary their mean
    def run(name, **more):
        nx.Nitro(
            HostTrainMetrics(max_epochs=1, n_train=16 * 6),
            run_dir=str(tmp_path / name),
            accum=2,
            steps_per_call=steps_per_call,
            checkpointer=None,
            **more,
        ).train()
        return read_lines(tmp_path / name / "metrics.jsonl")

    thin = run("thin")
    calls = step_losses(run("every", log_every_n_steps=1), "call")
    assert calls == {1: 2, 2: 4, 3: 6}
    (summary,) = [x for x in thin if x.get("context") == "train_epoch"]
    assert summary["step"] == 3
    assert_the_steps_mean(summary["call"], list(calls.values()))


def test_a_part_epoch_and_its_resumed_rest_each_end_with_a_summary_line(tmp_path):
    straight = nx.Nitro(
        TinyTrainAcc(max_epochs=2),
        run_dir=str(tmp_path / "straight"),
        log_every_n_steps=1,
        checkpointer=None,
    )
    straight.train()
    every = read_lines(tmp_path / "straight" / "metrics.jsonl")
    per_step = step_losses(every)
    accs = step_losses(every, "train_acc")
    run_dir = str(tmp_path / "run")
    nx.Nitro(TinyTrainAcc(max_epochs=2), run_dir=run_dir, max_steps=6).train()
    again = nx.Nitro(
        TinyTrainAcc(max_epochs=2), run_dir=run_dir, resume="auto", max_steps=8
    )
    again.train()
    lines = read_lines(os.path.join(run_dir, "metrics.jsonl"))
    summary = [x for x in lines if x.get("context") == "train_epoch"]
    # epoch 1; epoch 2's part up to max_steps; the whole of epoch 2, its mean
    # continuing from the batches trained before the resume
    assert [(x["epoch"], x["step"]) for x in summary] == [(1, 4), (2, 6), (2, 8)]
    for x, steps in zip(summary, ((1, 2, 3, 4), (5, 6), (5, 6, 7, 8)), strict=True):
        mean = np.mean([per_step[s] for s in steps])
        assert x["loss"] == pytest.approx(mean, rel=1e-6)
    assert summary[-1]["loss"] == straight.history[-1]["train_loss"]
    # the train_metrics' means cover the steps each process trained: the record
    # carries the loss sum alone
    for x, steps in zip(summary, ((1, 2, 3, 4), (5, 6), (7, 8)), strict=True):
        assert_the_steps_mean(x["train_acc"], [accs[s] for s in steps])


class HostTrainMetrics(Tiny):
    calls: list = nx.field(default_factory=list)  # Host: one entry per call

    def train_metrics(self, logits, *, y):
        self.calls.append(len(y))
        return {"call": len(self.calls)}

    def metrics_residency(self, hook):
        return "host"


def test_host_train_metrics_run_every_micro_batch_when_lines_are_thinned(tmp_path):
    nitro = nx.Nitro(
        HostTrainMetrics(max_epochs=1),
        run_dir=str(tmp_path),
        accum=2,
        log_every_n_steps=2,
        checkpointer=None,
    )
    nitro.train()
    assert nitro.experiment.calls == [16] * 4  # 4 micro-batches, 2 steps
    lines = read_lines(tmp_path / "metrics.jsonl")
    train = [x for x in lines if x.get("context") == "train"]
    # The one line written carries its step's last micro-batch's values.
    assert [(x["step"], x["call"]) for x in train] == [(2, 4)]
    # The summary, the mean of the steps' values: (2 + 4) / 2.
    summary = [x for x in lines if x.get("context") == "train_epoch"]
    assert [(x["step"], x["call"]) for x in summary] == [(2, 3.0)]


def test_logger_none_writes_nothing(tmp_path):
    nx.Nitro(
        Tiny(max_epochs=1), run_dir=str(tmp_path), logger=None, checkpointer=None
    ).train()
    assert os.listdir(tmp_path) == []


def test_a_logger_accessor_is_called_once_per_construction(tmp_path):
    made = []

    class Logged(Tiny):
        def logger(self):
            made.append(1)
            return nx.JSONLogger(str(tmp_path / "custom.jsonl"))

    nitro = nx.Nitro(Logged(max_epochs=1), checkpointer=None)
    nitro.train()
    nitro.validate()
    assert made == [1]
    assert read_lines(tmp_path / "custom.jsonl")[-1]["status"] == "completed"


def test_json_logger_appends_and_writes_each_line_but_train_lines_at_once(tmp_path):
    path = tmp_path / "m.jsonl"
    first = nx.JSONLogger(path)
    first.log_other("note", "a")
    assert read_lines(path) == [
        {"type": "other", "key": "note", "value": "a"}
    ]  # on disk before finish
    first.finish("completed")
    second = nx.JSONLogger(path)
    second.log_tags(["x"])
    second.log_confusion([[1, 0], [0, 1]], ["a", "b"], epoch=3)
    second.finish("error")
    assert [x["type"] for x in read_lines(path)] == [
        "other",
        "finish",
        "tags",
        "confusion",
        "finish",
    ]


def test_train_lines_wait_in_memory_until_flush_secs_pass_or_another_line(tmp_path):
    path = tmp_path / "m.jsonl"
    logger = nx.JSONLogger(path, flush_secs=3600)
    logger.log_metrics({"loss": 1.0}, step=1, epoch=1, context="train")
    logger.log_metrics({"loss": 0.5}, step=2, epoch=1, context="train")
    assert not path.exists()  # held: no write, no flush per step
    logger.log_metrics({"loss": 0.4}, step=2, epoch=1, context="validate")
    assert [(x["context"], x["loss"]) for x in read_lines(path)] == [
        ("train", 1.0),
        ("train", 0.5),
        ("validate", 0.4),
    ]  # the held lines first, in order
    logger.log_metrics({"loss": 0.3}, step=3, epoch=2, context="train")
    logger.flush()
    assert read_lines(path)[-1]["step"] == 3
    logger.log_metrics({"loss": 0.2}, step=4, epoch=2, context="train")
    logger.close()  # close writes what is held too
    assert read_lines(path)[-1]["step"] == 4

    quick = nx.JSONLogger(tmp_path / "q.jsonl", flush_secs=0.05)
    quick.log_metrics({"loss": 1.0}, step=1, epoch=1, context="train")
    time.sleep(0.06)
    quick.log_metrics({"loss": 0.9}, step=2, epoch=1, context="train")
    # the second line came flush_secs after the last write: both are on disk
    assert [x["step"] for x in read_lines(tmp_path / "q.jsonl")] == [1, 2]
    quick.close()


def test_an_epochs_summary_and_data_lines_are_written_with_its_epoch_line(
    tmp_path, monkeypatch
):
    path = tmp_path / "m.jsonl"
    logger = nx.JSONLogger(path, flush_secs=3600)
    logger.log_metrics({"loss": 0.5}, step=4, epoch=1, context="train_epoch")
    logger.log_metrics({"data_wait_frac": 0.1}, step=4, epoch=1, context="data")
    assert not path.exists()  # held for the epoch line
    logger.log_epoch({"epoch": 1, "step": 4, "train_loss": 0.5})
    assert [x.get("context", x["type"]) for x in read_lines(path)] == [
        "train_epoch",
        "data",
        "epoch",
    ]
    logger.log_metrics({"data_wait_frac": 0.2}, step=8, epoch=2, context="data")
    logger.close()  # a line held at close is written too
    assert read_lines(path)[-1]["data_wait_frac"] == 0.2

    # In a run, each write (a flush of what the logger held) by its lines' kinds.
    writes = []
    real = nx.JSONLogger.flush

    def counted(self):
        held = [e if isinstance(e, dict) else e[0] for e in self._held]
        kinds = [line.get("context", line["type"]) for line in held]
        if {"train_epoch", "validate", "data"} & set(kinds):
            writes.append(kinds)
        real(self)

    monkeypatch.setattr(nx.JSONLogger, "flush", counted)

    class NoVal(Tiny):
        def build_data(self, dist):
            return {"train": Tiny.build_data(self, dist)["train"]}

    for name, experiment in (("plain", NoVal), ("validated", Tiny)):
        writes.clear()
        run_dir = tmp_path / name
        nx.Nitro(
            experiment(max_epochs=2), run_dir=str(run_dir), checkpointer=None
        ).train()
        if name == "plain":  # nothing between them: one write an epoch
            assert writes == [["train_epoch", "data", "epoch"]] * 2
        else:  # the summary goes out before the validation runs
            assert writes == [["train_epoch"], ["validate"], ["data", "epoch"]] * 2
        kinds = [
            x.get("context", x["type"]) for x in read_lines(run_dir / "metrics.jsonl")
        ]
        assert kinds.count("train_epoch") == kinds.count("epoch") == 2

    # An on_epoch_end hook (user code, of any length) finds the summary written.
    seen = []
    hooked = nx.Nitro(NoVal(max_epochs=1), run_dir=str(tmp_path / "hooked"))
    log = tmp_path / "hooked" / "metrics.jsonl"
    hooked.on_epoch_end(
        lambda nitro, epoch, observations: seen.append(
            [x.get("context") for x in read_lines(log)].count("train_epoch")
        )
    )
    hooked.train()
    assert seen == [1]


def test_deferred_lines_are_read_back_when_written(tmp_path):
    path = tmp_path / "m.jsonl"
    logger = nx.JSONLogger(path, flush_secs=3600)
    built = []

    def build(values):
        built.append(values)
        return {"acc": float(values[0]), "bad": float(values[1])}

    for step in (1, 2, 3):
        values = (jnp.float32(step / 4), jnp.float32(np.nan))
        logger.log_deferred_metrics(
            DeferredMetrics(values, build), step=step, epoch=1, context="train"
        )
        # The first line is written at once; the others wait, unread.
        assert len(built) == 1 and len(read_lines(path)) == 1
    logger.finish("completed")
    assert len(built) == 3
    assert all(isinstance(v, np.ndarray | np.generic) for v in built[1])  # host
    lines = read_lines(path)
    # the non-finite value is dropped, as the protocol drops it from any line
    assert [x for x in lines if x["type"] == "metrics"] == [
        {"type": "metrics", "context": "train", "epoch": 1, "step": 1, "acc": 0.25},
        {"type": "metrics", "context": "train", "epoch": 1, "step": 2, "acc": 0.5},
        {"type": "metrics", "context": "train", "epoch": 1, "step": 3, "acc": 0.75},
    ]


def test_a_deferred_line_with_a_reserved_key_is_refused_the_others_written(tmp_path):
    path = tmp_path / "m.jsonl"
    logger = nx.JSONLogger(path, flush_secs=3600)
    for step, name in ((1, "acc"), (2, "acc"), (3, "epoch"), (4, "acc")):
        line = DeferredMetrics(jnp.float32(0.5), lambda v, n=name: {n: float(v)})
        logger.log_deferred_metrics(line, step=step, epoch=1, context="train")
    with pytest.raises(nx.ConfigError, match='context "train" is named `epoch`'):
        logger.flush()
    assert [x["step"] for x in read_lines(path)] == [1, 2, 4]
    logger.close()


def test_a_run_reads_its_train_lines_back_in_one_batch_per_epoch(tmp_path, monkeypatch):
    batches = []

    def counted(lines):
        batches.append(len(lines))
        return resolve_all(lines)

    monkeypatch.setattr("jaxnitro.logging.jsonl.resolve_all", counted)
    path = tmp_path / "m.jsonl"
    nitro = nx.Nitro(
        Tiny(max_epochs=2),
        logger=nx.JSONLogger(path, flush_secs=3600),
        checkpointer=None,
        log_every_n_steps=1,
    )
    nitro.train()
    # The first line at once, then the rest of each epoch when its steps end.
    assert [n for n in batches if n] == [1, 3, 4]
    train = [x for x in read_lines(path) if x.get("context") == "train"]
    assert [x["step"] for x in train] == list(range(1, 9))
    # each line's loss is its step's: epoch 2's four average to the history's
    epoch_2 = [x["loss"] for x in train if x["epoch"] == 2]
    assert np.mean(epoch_2) == pytest.approx(nitro.history[2]["train_loss"], rel=1e-6)


def test_a_logger_not_holding_lines_gets_a_deferred_line_resolved_at_once():
    seen = []

    class Plain(QuietLogger):
        def log_metrics(self, metrics, *, step, epoch, context, **kw):
            seen.append((step, metrics))

    line = DeferredMetrics(jnp.float32(0.5), lambda v: {"acc": v, "inf": np.inf})
    log_deferred(Plain(), line, step=7, epoch=1, context="train")
    assert seen == [(7, {"acc": 0.5})]  # host values, the non-finite one dropped
    assert isinstance(seen[0][1]["acc"], np.ndarray | np.generic)


def test_flush_secs_must_be_a_number_of_seconds():
    with pytest.raises(
        nx.ConfigError, match="flush_secs must be a number of seconds >= 0, got -1"
    ):
        nx.JSONLogger("m.jsonl", flush_secs=-1)


def test_a_partial_last_line_is_moved_aside_when_the_log_is_reopened(tmp_path):
    path = tmp_path / "m.jsonl"
    whole = '{"type": "metrics", "context": "train", "epoch": 1, "step": 1}\n'
    path.write_text(whole + '{"type": "metrics", "cont')
    logger = nx.JSONLogger(path)
    logger.bind_run_id("ab12cd34")
    with pytest.warns(
        nx.NitroWarning,
        match=r"m.jsonl ended in a partial line of 25 bytes, left by a process that "
        r"stopped mid-write: moved it to .*m.jsonl.partial",
    ):
        logger.log_other("note", "after")
    logger.close()
    assert (tmp_path / "m.jsonl.partial").read_text() == '{"type": "metrics", "cont\n'
    lines = read_lines(path)
    assert lines[0]["step"] == 1
    assert lines[1] == {
        "type": "other",
        "run_id": "ab12cd34",
        "key": "log_repaired",
        "value": {"bytes": 25, "moved_to": str(path) + ".partial"},
    }
    assert lines[2]["value"] == "after"
    assert len(pd.read_json(path, lines=True)) == 3


def test_a_whole_last_line_without_its_newline_is_kept(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"type": "tags", "tags": ["a"]}')
    logger = nx.JSONLogger(path)
    logger.log_tags(["b"])  # no warning: nothing was lost
    logger.close()
    assert [x["tags"] for x in read_lines(path)] == [["a"], ["b"]]
    assert not (tmp_path / "m.jsonl.partial").exists()


def test_json_logger_writes_strict_json_for_non_finite_array_elements(tmp_path):
    path = tmp_path / "m.jsonl"
    logger = nx.JSONLogger(path)
    logger.log_metrics(
        {"per_class": np.array([0.5, np.nan, np.inf])},
        step=1,
        epoch=1,
        context="validate",
    )
    logger.finish("completed")
    text = path.read_text().splitlines()[0]
    line = json.loads(text, parse_constant=lambda token: pytest.fail(token))
    assert line["per_class"] == [0.5, None, None]


class Keyed(Tiny):
    type: str = "mlp"  # a config field named like the line's own key


def test_json_logger_refuses_a_metric_or_param_named_like_a_line_key(tmp_path):
    logger = nx.JSONLogger(tmp_path / "m.jsonl")
    for key in ("type", "run_id", "context", "epoch", "step"):
        with pytest.raises(
            nx.ConfigError,
            match=f'context "train" is named `{key}`, a key JSONLogger\'s metrics '
            f"lines keep for themselves \\(type, run_id, context, epoch, step\\).* "
            f"Rename the metric",
        ):
            logger.log_metrics({key: 0.5}, step=1, epoch=1, context="train")
    for key in ("type", "run_id"):
        with pytest.raises(
            nx.ConfigError,
            match=f"parameter `{key}` \\('mlp'\\) has the name of a key JSONLogger's "
            f"lines keep for themselves \\(type, run_id\\)",
        ):
            logger.log_params({key: "mlp"})
    assert not (tmp_path / "m.jsonl").exists()  # nothing half-written
    with pytest.raises(nx.ConfigError, match="Rename the experiment field"):
        nx.Nitro(Keyed(), run_dir=str(tmp_path), checkpointer=None)  # at setup
    nx.Nitro(Keyed(), logger=None, checkpointer=None)  # only the JSON line clashes


class Logged(Tiny):
    widths: nx.GraphConst[tuple] = ((8, 4), 2)
    weights: nx.Device[np.ndarray] = nx.field(
        default_factory=lambda: np.ones(3, np.float32)
    )
    images: np.ndarray = nx.field(
        default_factory=lambda: np.zeros((100, 8), np.float32)
    )
    names: list = nx.field(default_factory=lambda: ["a", "b"])
    scale: np.float32 = nx.field(default_factory=lambda: np.float32(0.5))


def params_line(tmp_path):
    nx.Nitro(Logged(), run_dir=str(tmp_path), checkpointer=None)
    return read_lines(tmp_path / "metrics.jsonl")[0]


def test_params_line_logs_non_scalar_graphconst_and_device_fields_by_type(tmp_path):
    params = params_line(tmp_path)
    assert params["widths"] == "tuple"  # the spec's rule: a non-scalar logs its type
    assert params["weights"] == "float32[3] on device"  # Device: type and size


def test_params_line_leaves_out_non_scalar_host_values(tmp_path):
    params = params_line(tmp_path)
    assert "images" not in params and "names" not in params
    assert params["scale"] == 0.5 and params["n_train"] == 64  # scalars are logged


WORKER = os.path.join(os.path.dirname(experiments.__file__), "log_crash_worker.py")


@pytest.mark.slow
def test_a_log_a_kill_tore_is_repaired_by_the_resumed_run_which_marks_its_start(
    tmp_path,
):
    """A real process killed (SIGKILL) mid-write in epoch 3 leaves a partial last
    line; the resumed run moves it aside, says so, and writes a resume line."""
    env = {**os.environ, "JAXNITRO_COMPILATION_CACHE": "off", "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(
        [sys.executable, WORKER, str(tmp_path), "3"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    path = tmp_path / "metrics.jsonl"
    torn = path.read_bytes()
    assert not torn.endswith(b"\n")  # the kill cut a line
    fragment = torn[torn.rindex(b"\n") + 1 :]
    crashed = [json.loads(x) for x in torn[: -len(fragment)].decode().splitlines()]
    run_id = crashed[0]["run_id"]
    # Epochs 1 and 2 were written whole: each epoch's lines reach the file at its end.
    steps = [x["step"] for x in crashed if x.get("context") == "train"]
    assert steps[:8] == list(range(1, 9)) and set(steps[8:]) <= {9, 10, 11, 12}

    with pytest.warns(nx.NitroWarning, match="ended in a partial line of"):
        resumed = nx.Nitro(
            Tiny(max_epochs=4),
            run_dir=str(tmp_path),
            resume="auto",
            log_every_n_steps=1,
        )
    resumed.train()
    assert (tmp_path / "metrics.jsonl.partial").read_bytes() == fragment + b"\n"
    df = pd.read_json(path, lines=True)
    assert set(df["run_id"]) == {run_id}  # the resume continues the same run
    (at,) = df.index[df["type"] == "resume"]
    resume = df.loc[at]
    assert (resume["step"], resume["epoch"], resume["run_id"]) == (8, 2, run_id)
    assert resume["source"].endswith(".safetensors")
    repaired = df.loc[at - 1]
    assert repaired["key"] == "log_repaired"
    assert repaired["value"]["bytes"] == len(fragment)
    # The segments: lines before the resume line past its step were trained again.
    train = df[df["context"] == "train"]
    before, after = train[train.index < at], train[train.index > at]
    assert list(after["step"]) == list(range(9, 17))
    assert list(before["step"][before["step"] > 8]) == steps[8:]
    assert df.iloc[-1]["type"] == "finish" and df.iloc[-1]["status"] == "completed"
