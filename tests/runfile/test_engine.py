"""Run files on the engine: the model, the groups, a run's loss, counters and cache."""

from __future__ import annotations

import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxnitro as nx
from jaxnitro.runfile.cadence import cadence_plan
from jaxnitro.runfile.engine import compile_run, experiment, handle_keywords
from jaxnitro.runfile.knobs import Selection
from jaxnitro.runfile.running import run_file
from jaxnitro.runfile.source import RunfileError
from jaxnitro.runfile.stdlib_nn import GPTSpec, flatten, nest

EXAMPLES = Path(__file__).parents[2] / "examples" / "runfiles"


@pytest.fixture
def minimal(tmp_path):
    """The minimal example and its data, copied beside each other."""
    shutil.copytree(EXAMPLES / "data", tmp_path / "data")
    return tmp_path / "minimal.sx"


def test_gpt_parameters_are_the_declared_names_and_a_causal_forward_pass():
    spec = GPTSpec(vocab=11, layers=2, dim=8, heads=2, context=6)
    params = spec.init(jax.random.key(0))
    assert {n: p.shape for n, p in params.items()} == spec.parameter_shapes()
    assert flatten(nest(params)).keys() == params.keys()
    assert "blocks" in nest(params)["model"]
    tokens = jnp.array([[1, 2, 3, 4, 5], [5, 4, 3, 2, 1]], jnp.int32)
    apply = jax.jit(lambda p, t: spec.apply(p, t, span=None))
    logits = apply(params, tokens)
    assert logits.shape == (2, 5, 11) and logits.dtype == jnp.float32
    changed = tokens.at[:, 4].set(9)  # the last token never reaches earlier positions
    np.testing.assert_allclose(apply(params, changed)[:, :4], logits[:, :4], rtol=1e-5)


def test_cadence_blocks_the_steps_into_epochs_the_last_one_shorter():
    plan = cadence_plan(steps=3, cadence=2, microbatches=2)
    assert plan.epochs == 2 and plan.batches_per_epoch == (4, 2)
    assert cadence_plan(steps=20, cadence=5, microbatches=1).steps_per_epoch == (5,) * 4


def test_the_minimal_example_trains_20_steps_and_its_loss_falls(minimal, tmp_path):
    minimal.write_text((EXAMPLES / "minimal.sx").read_text())
    outcome = run_file(str(minimal), run_dir=str(tmp_path / "run"))
    losses = [row["train_loss"] for row in outcome.handle.history]
    assert outcome.steps == 20 and len(losses) == 10  # cadence 2: ten blocks
    assert losses[0] == pytest.approx(np.log(32), abs=0.05)  # uniform at the start
    assert outcome.train_loss < losses[0] - 0.3  # the stated margin
    assert outcome.counters == {"records": 20 * 2 * 4, "tokens": 20 * 2 * 4 * 17}
    assert outcome.lines()[1:] == ["  counter records 160", "  counter tokens 2720"]
    assert list((tmp_path / "run").glob("*.safetensors"))


SWEPT = """
(require "sexpgpu/nn" cross-entropy gpt)
(require "sexpgpu/optim" adamw cosine)
(defknobs (lr 0.01 "peak rate") (width 16 "model width"))
(defvar train-loader
  (loader :sources [(files ["data/tiny-train.jsonl.gz"])]
          :fields [(field :tokens :from "input_ids" :dtype :i32 :shape [17])]
          :batch-size 2))
(defun prepare (batch)
  (let ((tokens (field batch :tokens)))
    (list :inputs (slice tokens 1 0 16) :targets (slice tokens 1 1 17))))
(defvar model (gpt :vocab 32 :layers 1 :dim width :heads 2 :context 16))
(defun objective (prediction targets) (cross-entropy prediction targets))
(defvar optimizer
  (adamw :lr (cosine lr :warmup-steps 1) :weight-decay 0.1
         :groups [(group (select :rank-below 2) :lr 0.02 :weight-decay 0.0)]))
(defrun :steps 2 :cadence 2 :seed 3)
"""


def test_a_learning_rate_sweep_compiles_once_and_a_width_change_recompiles(
    minimal, tmp_path
):
    path = minimal.with_name("swept.sx")
    path.write_text(SWEPT)
    first = compile_run(str(path), Selection(sets=(("lr", "0.01"),)))
    again = compile_run(str(path), Selection(sets=(("lr", "0.05"),)))
    wider = compile_run(str(path), Selection(sets=(("width", "32"),)))
    assert first.graph == again.graph != wider.graph
    assert [g.name for g in first.groups] == ["group-1", "default"]
    nx.compile.cache_reset()
    run_file(str(path), Selection(sets=(("lr", "0.01"),)), run_dir=str(tmp_path / "a"))
    compiled = nx.cache_stats()["misses"]
    run_file(str(path), Selection(sets=(("lr", "0.05"),)), run_dir=str(tmp_path / "b"))
    assert nx.cache_stats()["misses"] == compiled  # the second rate compiled nothing


def test_a_missing_data_file_is_refused_before_training(tmp_path):
    path = tmp_path / "minimal.sx"
    path.write_text((EXAMPLES / "minimal.sx").read_text())
    with pytest.raises(RunfileError, match="no data file") as caught:
        run_file(str(path), run_dir=str(tmp_path / "run"))
    assert caught.value.codes == ["E-LOAD-008"]


GROUPED = """
(require "sexpgpu/nn" cross-entropy gpt)
(require "sexpgpu/optim" sgd)
(defvar train-loader
  (loader :sources [(files ["data/tiny-train.jsonl.gz"])]
          :fields [(field :tokens :from "input_ids" :dtype :i32 :shape [17])]
          :batch-size 4))
(defun prepare (batch)
  (let ((tokens (field batch :tokens)))
    (list :inputs (slice tokens 1 0 16) :targets (slice tokens 1 1 17))))
(defvar model (gpt :vocab 32 :layers 1 :dim 16 :heads 2 :context 16))
(defun objective (prediction targets) (cross-entropy prediction targets))
(defvar optimizer
  (sgd :lr 0.5 :weight-decay 0.1
       :groups [(group (select "model.embed.*") :lr 0.25 :weight-decay 0.0)]))
(defrun :steps 1 :seed 4)
"""


def test_each_group_steps_with_its_own_rate_and_decay(minimal, tmp_path):
    path = minimal.with_name("grouped.sx")
    path.write_text(GROUPED)
    compiled = compile_run(str(path))
    handle = nx.Nitro(experiment(compiled), **handle_keywords(compiled, str(tmp_path)))
    before = flatten(jax.device_get(handle.parameters))
    batch = compiled.splits()["train"].batch_at(0, 0)  # the first step's batch

    def objective(params):
        return compiled.objective(*compiled.parts(params, batch, train=True))

    grads = flatten(jax.jit(jax.grad(objective))(nest(before)))
    after = flatten(jax.device_get(handle.train().parameters))
    for name in ("model.embed.token", "model.blocks.0.mlp.up.weight"):
        lr, decay = (0.25, 0.0) if name.startswith("model.embed") else (0.5, 0.1)
        expected = before[name] - lr * grads[name] - lr * decay * before[name]
        np.testing.assert_allclose(after[name], expected, rtol=1e-4, atol=1e-6)


def test_a_later_bad_record_stops_the_run_at_its_batch(tmp_path):
    import gzip
    import json

    (tmp_path / "data").mkdir()
    rows = [{"input_ids": [(i + j) % 32 for j in range(17)]} for i in range(40)]
    rows[30] = {"input_ids": [1, 2]}
    text = "".join(json.dumps(r) + "\n" for r in rows).encode()
    (tmp_path / "data" / "tiny-train.jsonl.gz").write_bytes(gzip.compress(text))
    path = tmp_path / "minimal.sx"
    path.write_text((EXAMPLES / "minimal.sx").read_text())
    with pytest.raises(RunfileError, match=r"tiny-train.jsonl.gz:31: field :tokens"):
        run_file(str(path), run_dir=str(tmp_path / "run"))


TENSORS = """
(require "sexpgpu/nn" cross-entropy gpt)
(require "sexpgpu/optim" sgd)
(defvar train-loader
  (loader :sources [(files ["data/tiny-train.jsonl.gz"])]
          :fields [(field :tokens :from "input_ids" :dtype :i32 :shape [17])]
          :batch-size 4))
(defun prepare (batch)
  (let ((tokens (cast (field batch :tokens) :i32))
        (halves (concat [(slice tokens 0 0 2) (slice tokens 0 2 4)] 0))
        (flat (reshape (slice halves 1 0 16) [-1])))
    (list :inputs (reshape flat [4 16]) :targets (slice tokens 1 1 17))))
(defvar model (gpt :vocab 32 :layers 1 :dim 16 :heads 2 :context 16))
(defun objective (prediction targets) (cross-entropy prediction targets))
(defvar optimizer (sgd :lr 0.1))
(defrun :steps 1 :seed 4)
"""


def test_prepare_reshapes_casts_and_concatenates_traced_arrays(minimal):
    path = minimal.with_name("tensors.sx")
    path.write_text(TENSORS)
    compiled = compile_run(str(path))
    batch = compiled.splits()["train"].batch_at(0, 0)
    params = nest(compiled.model.init(jax.random.key(0)))
    prediction, targets = jax.jit(lambda p: compiled.parts(p, batch, train=True))(
        params
    )
    assert prediction.shape == (4, 16, 32)
    np.testing.assert_array_equal(targets, batch["tokens"][:, 1:])
    for bad, code in (
        ("(reshape flat [4 15])", "E-SHAPE-009"),
        ("(concat [flat halves] 0)", "E-SHAPE-010"),
        ("(cast flat :int)", "E-LOAD-004"),
    ):
        path.write_text(TENSORS.replace("(reshape flat [4 16])", bad))
        with pytest.raises(RunfileError) as caught:
            compile_run(str(path))
        assert caught.value.codes == [code]


def test_a_resumed_run_reads_the_same_records_and_ends_bit_for_bit_equal(
    minimal, tmp_path
):
    minimal.write_text((EXAMPLES / "minimal.sx").read_text())

    def handle(steps, run_dir, **keywords):
        compiled = compile_run(str(minimal), steps=steps)
        run = handle_keywords(compiled, str(tmp_path / run_dir))
        return nx.Nitro(experiment(compiled), **run, **keywords)

    whole = flatten(jax.device_get(handle(6, "whole").train().parameters))
    handle(2, "parts").train()  # one cadence block, then a new handle resumes
    resumed = handle(6, "parts", resume="auto").train()
    assert [row["step"] for row in resumed.history][-1] == 6
    for name, value in flatten(jax.device_get(resumed.parameters)).items():
        np.testing.assert_array_equal(value, whole[name])


def test_adamw_groups_step_as_optax_adamw_with_each_groups_settings(minimal, tmp_path):
    import optax

    path = minimal.with_name("adamw.sx")
    path.write_text(
        GROUPED.replace('"sexpgpu/optim" sgd', '"sexpgpu/optim" adamw sgd').replace(
            """(sgd :lr 0.5 :weight-decay 0.1
       :groups [(group (select "model.embed.*") :lr 0.25 :weight-decay 0.0)])""",
            """(adamw :lr 0.01 :betas [0.9 0.95] :eps 1e-6 :weight-decay 0.1
         :groups [(group (select "model.embed.*") :lr 0.02 :betas [0.8 0.9]
                         :weight-decay 0.0)])""",
        )
    )
    compiled = compile_run(str(path))
    handle = nx.Nitro(experiment(compiled), **handle_keywords(compiled, str(tmp_path)))
    before = flatten(jax.device_get(handle.parameters))
    batch = compiled.splits()["train"].batch_at(0, 0)

    def objective(params):
        return compiled.objective(*compiled.parts(params, batch, train=True))

    grads = flatten(jax.jit(jax.grad(objective))(nest(before)))
    after = flatten(jax.device_get(handle.train().parameters))
    for name, rule in (
        ("model.embed.token", optax.adamw(0.02, 0.8, 0.9, 1e-6, weight_decay=0.0)),
        ("model.head.weight", optax.adamw(0.01, 0.9, 0.95, 1e-6, weight_decay=0.1)),
    ):
        updates, _ = rule.update(grads[name], rule.init(before[name]), before[name])
        expected = optax.apply_updates(before[name], updates)
        np.testing.assert_allclose(after[name], expected, rtol=1e-4, atol=1e-6)


def test_bf16_precision_computes_in_bf16_and_keeps_f32_master_weights(
    minimal, tmp_path
):
    text = (EXAMPLES / "minimal.sx").read_text()
    minimal.write_text(text)
    f32 = run_file(str(minimal), steps=4, run_dir=str(tmp_path / "f32"))
    minimal.write_text(text.replace(":precision :f32", ":precision :bf16"))
    bf16 = run_file(str(minimal), steps=4, run_dir=str(tmp_path / "bf16"))
    assert bf16.handle.config.precision == "bf16"
    weights = jax.tree.leaves(bf16.handle.parameters)
    assert {w.dtype for w in weights} == {jnp.dtype("float32")}
    assert bf16.train_loss == pytest.approx(f32.train_loss, abs=0.05)
    assert bf16.train_loss != f32.train_loss  # bf16 matmuls round differently
