"""nitro.cost_report(): XLA's cost analysis of each program, against the clock."""

import io
import json

import pytest
from experiments import Tiny, make_batches

import jaxnitro as nx
from jaxnitro.devices.peaks import peak_flops
from jaxnitro.run import costs
from jaxnitro.run import training as train


def test_cost_report_lists_each_program_and_the_achieved_step_rate():
    nitro = nx.Nitro(Tiny(), logger=None, checkpointer=None)
    out = io.StringIO()
    assert nitro.cost_report(file=out) == []
    assert "no program compiled yet" in out.getvalue()
    nitro.train()
    out = io.StringIO()
    rows = nitro.cost_report(file=out)
    text = out.getvalue()
    by_program = {row["program"]: row for row in rows}
    step = by_program["train_step"]
    # The MLP 8-16-3 at batch 16: the forward matmuls alone are 2*16*(8*16+16*3).
    assert step["flops"] > 2 * 16 * (8 * 16 + 16 * 3)
    assert step["bytes"] > 0
    assert "eval_forward" in by_program  # validation compiled its programs too
    measured = by_program["optimizer step"]
    assert measured["seconds"] == nitro.status.step_seconds > 0
    assert measured["flops"] == step["flops"]
    assert measured["flops_per_second"] == step["flops"] / measured["seconds"]
    assert "train_step" in text and "achieved" in text


def test_with_accumulation_the_report_lists_the_program_without_step_rates():
    nitro = nx.Nitro(Tiny(max_epochs=1), logger=None, checkpointer=None, accum=2)
    nitro.train()
    out = io.StringIO()
    rows = nitro.cost_report(file=out)
    assert [row["program"] for row in rows].count("train_step") == 1
    assert "optimizer step" not in {row["program"] for row in rows}
    assert "not estimated under accumulation" in out.getvalue()


def test_before_an_epoch_is_trained_the_step_time_is_not_measured():
    nitro = nx.Nitro(Tiny(), logger=None, checkpointer=None)
    nitro.predict(make_batches(4, 4)[0])
    out = io.StringIO()
    rows = nitro.cost_report(file=out)
    assert [row["program"] for row in rows] == ["eval_forward"]
    assert "step time: not measured yet" in out.getvalue()


def test_at_steps_per_call_the_step_costs_what_it_costs_at_one():
    def step_row(k):
        nitro = nx.Nitro(
            Tiny(max_epochs=1), logger=None, checkpointer=None, steps_per_call=k
        )
        nitro.train()
        rows = nitro.cost_report(file=io.StringIO())
        return next(row for row in rows if row["program"] == "optimizer step")

    # The same step (the loop's bookkeeping adds a few dozen FLOPs on a CPU, 195 on
    # a TPU: against Tiny's 18k, a bound in FLOPs rather than a ratio).
    one, four = step_row(1), step_row(4)
    assert one["flops"] > 0
    assert four["flops"] == pytest.approx(one["flops"], abs=400)


class _Device:
    def __init__(self, kind: str) -> None:
        self.device_kind = kind


def test_a_known_device_gets_mfu_against_its_peak_and_an_unknown_one_says_so(
    monkeypatch,
):
    nitro = nx.Nitro(Tiny(max_epochs=1), logger=None, checkpointer=None)
    nitro.train()
    # A device on no record (a CPU's kind; stood in, so the test runs anywhere).
    monkeypatch.setattr(costs.jax, "devices", lambda: [_Device("cpu")])
    out = io.StringIO()
    rows = nitro.cost_report(file=out)
    measured = next(row for row in rows if row["program"] == "optimizer step")
    assert "mfu" not in measured  # never guessed
    assert "MFU unknown: no peak on record for device kind 'cpu'" in out.getvalue()
    # 16 samples a step (Tiny's batch), at the measured step time.
    assert measured["samples_per_sec"] == pytest.approx(16 / measured["seconds"])
    monkeypatch.setattr(costs.jax, "devices", lambda: [_Device("TPU v5 lite")])
    out = io.StringIO()
    rows = nitro.cost_report(file=out)
    measured = next(row for row in rows if row["program"] == "optimizer step")
    expected = measured["flops"] / measured["seconds"] / 197e12
    assert measured["mfu"] == pytest.approx(expected)
    assert "of the TPU v5 lite's 197 TFLOP/s bf16 dense peak" in out.getvalue()


def test_every_epoch_logs_its_speed_and_mfu_where_the_peak_is_known(
    tmp_path, monkeypatch
):
    # As on a TPU v5e: the table's peak for the CPU device the run trains on.
    monkeypatch.setattr(train, "device_peak", lambda device: peak_flops("TPU v5 lite"))
    nitro = nx.Nitro(Tiny(max_epochs=2), run_dir=str(tmp_path), checkpointer=None)
    nitro.train()
    rows = [
        json.loads(line)
        for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
        if json.loads(line).get("context") == "data"
    ]
    assert [row["epoch"] for row in rows] == [1, 2]
    last = rows[-1]
    seconds = nitro.status.step_seconds  # the last epoch's
    assert last["steps_per_sec"] == pytest.approx(1 / seconds)
    assert last["samples_per_sec"] == pytest.approx(16 / seconds)
    # The last epoch's program (the second where "auto" is the default, on a TPU).
    trains = [p for kind, p in nitro.executables.compiled() if kind == "train_step"]
    program = trains[-1]
    flops = program.cost_analysis()["flops"]
    assert last["mfu"] == pytest.approx(flops / seconds / 197e12)
