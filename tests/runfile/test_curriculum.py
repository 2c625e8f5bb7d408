"""`curriculum`: the stage between cadence blocks, what it changes, and its resume."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxnitro.runfile.engine import compile_run
from jaxnitro.runfile.evaluator import evaluate_file
from jaxnitro.runfile.running import build_handle, run_file
from jaxnitro.runfile.source import RunfileError
from jaxnitro.runfile.stdlib_nn import flatten

EXAMPLES = Path(__file__).parents[2] / "examples" / "runfiles"

STAGED = """
(require "sexpgpu/nn" cross-entropy gpt)
(require "sexpgpu/optim" sgd)
(defknobs (boost 2.0 "the rate's factor from block 3 on"))
(defvar fields [(field :tokens :from "input_ids" :dtype :i32 :shape [17])])
(defvar train-loader
  (loader :sources [(files ["data/tiny-train.jsonl.gz"])] :fields fields
          :batch-size 4))
(defvar other-loader
  (loader :sources [(files ["data/tiny-other.jsonl.gz"])] :fields fields
          :batch-size 4))
(defun prepare (batch)
  (let ((tokens (field batch :tokens)))
    (list :inputs (slice tokens 1 0 16) :targets (slice tokens 1 1 17))))
(defvar model (gpt :vocab 32 :layers 1 :dim 16 :heads 2 :context 16))
(defun objective (prediction targets) (cross-entropy prediction targets))
(defvar optimizer (sgd :lr 0.5))
(defun curriculum (stage ctx observations)
  (let ((count (+ 1 (get stage :count 0)))
        (loss (get observations :train/loss)))
    (list :count count
          :lr-scale (if (>= (get ctx :block) 2) (get (get ctx :knobs) :boost) 1.0)
          :loader (if (> count 1) other-loader train-loader)
          :last-loss loss)))
(defrun :steps 6 :cadence 2 :seed 1)
"""


@pytest.fixture
def staged(tmp_path):
    shutil.copytree(EXAMPLES / "data", tmp_path / "data")
    records = gzip.decompress((tmp_path / "data" / "tiny-train.jsonl.gz").read_bytes())
    other = b"\n".join(reversed(records.splitlines())) + b"\n"  # other batches
    (tmp_path / "data" / "tiny-other.jsonl.gz").write_bytes(gzip.compress(other))
    path = tmp_path / "staged.sx"
    path.write_text(STAGED)
    return path


def lines(run_dir: Path) -> list[dict]:
    text = (run_dir / "metrics.jsonl").read_text()
    return [json.loads(x) for x in text.splitlines()]


def test_a_curriculum_raises_the_rate_after_block_2_and_logs_its_stage(
    staged, tmp_path
):
    run_file(str(staged), run_dir=str(tmp_path / "run"))
    logged = lines(tmp_path / "run")
    stages = [x for x in logged if x.get("context") == "curriculum"]
    assert [x["step"] for x in stages] == [2, 4, 6]
    assert stages[0]["curriculum/stage"].startswith(
        "[:count 1 :lr-scale 1.0 :loader train-loader :last-loss 3."
    )
    assert (
        ":count 3 :lr-scale 2.0 :loader other-loader" in stages[2]["curriculum/stage"]
    )
    rates = {
        x["step"]: value
        for x in logged
        if x.get("context") == "train"
        for key, value in x.items()
        if key.startswith("schedule/")
    }
    # block 1 ran at 0.5; block 2's end set :lr-scale 2.0 for block 3
    assert rates[2] == pytest.approx(0.5) and rates[4] == pytest.approx(0.5)
    assert rates[6] == pytest.approx(1.0)
    saved = json.loads((tmp_path / "run" / "curriculum.json").read_text())
    assert sorted(saved["stages"], key=int) == ["2", "4", "6"]


def test_a_resumed_run_continues_in_its_stage_bit_for_bit(staged, tmp_path):
    def train(steps, run_dir, **keywords):
        compiled = compile_run(str(staged), steps=steps)
        handle, end = build_handle(compiled, str(tmp_path / run_dir), **keywords)
        handle.train()
        return handle, end

    whole, whole_end = train(6, "whole")
    train(4, "parts")
    resumed, resumed_end = train(6, "parts", resume="auto")
    assert resumed_end.stage[:4] == whole_end.stage[:4]  # :count 3 :lr-scale 2.0
    straight = flatten(jax.device_get(whole.parameters))
    for name, value in flatten(jax.device_get(resumed.parameters)).items():
        np.testing.assert_array_equal(value, straight[name])


def test_a_stage_that_would_reshape_the_programs_is_refused(staged, tmp_path):
    staged.write_text(
        STAGED.replace(
            '["data/tiny-other.jsonl.gz"])] :fields fields\n          :batch-size 4',
            '["data/tiny-other.jsonl.gz"])] :fields fields\n          :batch-size 8',
        )
    )
    with pytest.raises(RunfileError) as caught:
        run_file(str(staged), run_dir=str(tmp_path / "run"))
    assert caught.value.codes == ["E-RUN-006"]
    assert "other batch-size than train-loader (8 against 4)" in str(caught.value)
    staged.write_text(STAGED.replace("(get (get ctx :knobs) :boost)", "0"))
    with pytest.raises(RunfileError, match="sets :lr-scale 0; it must be a positive"):
        run_file(str(staged), run_dir=str(tmp_path / "zero"))


def test_get_reads_a_keyword_list_and_names_a_missing_key(tmp_path):
    path = tmp_path / "get.sx"
    path.write_text(
        "(defvar a (get (list :x 1 :y 2) :y))\n(defvar b (get (list) :z 5))\n"
    )
    result = evaluate_file(str(path))
    assert (result.value("a"), result.value("b")) == (2, 5)
    path.write_text("(defvar a (get (list :step 1 :block 2) :stpe))\n")
    with pytest.raises(RunfileError, match=r"no key :stpe \(it has :step :block\)"):
        evaluate_file(str(path))
    path.write_text("(defvar a (get 3 :x))\n")
    with pytest.raises(RunfileError, match=r"reads a keyword list, got an integer"):
        evaluate_file(str(path))


def test_explain_says_when_the_curriculum_runs(staged):
    from jaxnitro.runfile.explain import explain_lines

    lines = explain_lines(str(staged))
    assert (
        "curriculum: after each cadence block; a stage's :lr-scale and :loader "
        "apply from the next block" in lines
    )
    assert "run: 6 steps in 3 cadence blocks of 2 steps" in "\n".join(lines)


@pytest.mark.parametrize(
    ("stage", "code", "message"),
    [
        ("(list :loader 3)", "E-RUN-006", "sets :loader to an integer"),
        ("(list :lr-scale :x)", "E-RUN-005", "sets :lr-scale :x; it must be"),
        ("(list :next prepare)", "E-RUN-005", "returned a function of 1 argument"),
    ],
)
def test_a_stage_the_engine_cannot_apply_or_keep_is_refused(
    staged, tmp_path, stage, code, message
):
    text = STAGED[: STAGED.index("(defun curriculum")]
    text += f"(defun curriculum (stage ctx observations) {stage})\n"
    staged.write_text(text + "(defrun :steps 2 :cadence 1 :seed 1)\n")
    with pytest.raises(RunfileError, match=message) as caught:
        run_file(str(staged), run_dir=str(tmp_path / "run"))
    assert caught.value.codes == [code]
