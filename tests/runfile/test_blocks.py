"""Between cadence blocks: several evaluation passes, each on its own loader and
period, named in the logs; the pass checks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from jaxnitro.runfile.check import check_file
from jaxnitro.runfile.running import run_file
from jaxnitro.runfile.source import RunfileError

EXAMPLES = Path(__file__).parents[2] / "examples" / "runfiles"

PASSES = """
(require "sexpgpu/nn" cross-entropy gpt)
(require "sexpgpu/optim" sgd)
(defvar fields [(field :tokens :from "input_ids" :dtype :i32 :shape [17])])
(defvar train-loader
  (loader :sources [(files ["data/tiny-train.jsonl.gz"])] :fields fields
          :batch-size 4))
(defeval quick
  :loader (loader :sources [(files ["data/tiny-train.jsonl.gz"])] :fields fields
                  :batch-size 4)
  :batches 1)
(defeval slow
  :loader (loader :sources [(files ["data/tiny-train.jsonl.gz"])] :fields fields
                  :batch-size 2)
  :every 4
  :batches 3)
(defun prepare (batch)
  (let ((tokens (field batch :tokens)))
    (list :inputs (slice tokens 1 0 16) :targets (slice tokens 1 1 17))))
(defvar model (gpt :vocab 32 :layers 1 :dim 16 :heads 2 :context 16))
(defun objective (prediction targets) (cross-entropy prediction targets :reduce :sum))
(defun evaluate (prediction targets)
  (list :loss (cross-entropy prediction targets)))
(defvar optimizer (sgd :lr 0.002))
(defrun :steps 6 :cadence 2 :seed 1)
"""


@pytest.fixture
def folder(tmp_path):
    shutil.copytree(EXAMPLES / "data", tmp_path / "data")
    return tmp_path


def test_each_pass_runs_on_its_period_and_is_logged_under_its_name(folder):
    path = folder / "passes.sx"
    path.write_text(PASSES)
    outcome = run_file(str(path), run_dir=str(folder / "run"))
    lines = [
        json.loads(x)
        for x in (folder / "run" / "metrics.jsonl").read_text().split("\n")
        if x
    ]
    validate = {x["step"]: x for x in lines if x.get("context") == "validate"}
    assert sorted(validate) == [2, 4, 6]
    quick = {"quick/loss", "quick/objective"}
    assert set(validate[2]) & {"quick/loss", "slow/loss"} == {"quick/loss"}
    assert quick | {"slow/loss", "slow/objective"} <= set(validate[4])  # :every 4
    assert {"slow/loss", "slow/objective"} <= set(validate[6])  # the last step
    # the objective sums over the batch's 4 x 16 tokens; evaluate's loss is per token
    per_token = validate[6]["quick/loss"]
    assert validate[6]["quick/objective"] == pytest.approx(per_token * 64, rel=1e-4)
    assert validate[6]["slow/objective"] == pytest.approx(
        validate[6]["slow/loss"] * 32, rel=1e-4
    )
    rows = list(outcome.handle.history)
    assert rows[1]["slow/loss"] == validate[4]["slow/loss"]
    assert outcome.lines()[0].startswith("eval quick at step 6: quick/objective ")
    assert outcome.lines()[1].startswith("eval slow at step 6: slow/objective ")
    assert outcome.lines()[2].startswith("done: 6 steps, train/loss ")


@pytest.mark.parametrize(
    ("change", "code", "message"),
    [
        (":every 4", ":every 3", "E-RUN-004"),
        ("(defeval slow", "(defeval quick", "E-RUN-007"),
        ("(defeval slow", "(defeval train", "E-RUN-007"),
    ],
)
def test_a_pass_the_run_cannot_schedule_is_refused_by_check(
    folder, change, code, message
):
    path = folder / "bad.sx"
    path.write_text(PASSES.replace(change, code))
    with pytest.raises(RunfileError) as caught:
        check_file(str(path))
    assert caught.value.codes == [message]
    expected = {
        "E-RUN-004": "pass `slow` runs :every 3 steps, which is not a multiple of "
        "defrun's :cadence 2",
        "E-RUN-007": "an evaluation pass named",
    }[message]
    assert expected in str(caught.value)


def test_sexpgpu_run_prints_each_pass_before_the_done_line(folder, capsys):
    from jaxnitro.cli import main

    path = folder / "passes.sx"
    path.write_text(PASSES)
    run_dir = str(folder / "run")
    assert main(["run", str(path), "--steps", "4", "--run-dir", run_dir]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("eval quick at step 4: quick/objective ")
    assert out[1].startswith("eval slow at step 4: slow/objective ")
    assert out[2].startswith("done: 4 steps, train/loss ")
    assert out[3:] == ["  counter records 16", "  counter tokens 272"]


def test_the_curriculum_observes_the_passes_that_ran_in_its_block(folder):
    path = folder / "observed.sx"
    path.write_text(
        PASSES.replace(
            "(defrun",
            "(defun curriculum (stage ctx observations)\n"
            "  (list :slow (get observations :slow/loss -1.0)\n"
            "        :train (get observations :train/loss)))\n(defrun",
        )
    )
    rows = list(run_file(str(path), run_dir=str(folder / "run")).handle.history)
    text = (folder / "run" / "metrics.jsonl").read_text()
    lines = [json.loads(x) for x in text.splitlines()]
    stages = {
        x["step"]: x["curriculum/stage"] for x in lines if "curriculum/stage" in x
    }
    validate = {x["step"]: x for x in lines if x.get("context") == "validate"}
    assert stages[2].startswith("[:slow -1.0 :train ")  # slow runs every 4 steps
    slow = float(stages[4].split()[1])
    assert slow == pytest.approx(validate[4]["slow/loss"], rel=1e-6)
    train = float(stages[6].split()[3][:-1])  # the block's mean objective
    assert train == pytest.approx(rows[2]["train_loss"], rel=1e-6)
