"""step_rng(): the traced step's key, folded from (seed, step, micro-batch)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from compile_counts import kinds_compiled
from experiments import QuietLogger, StopsAtStep, Tiny, mlp
from export_experiments import Exportable

import jaxnitro as nx
from jaxnitro.experiment.rng import step_rng_input


class TrainLines(QuietLogger):
    """Keeps every train line's metrics by step."""

    def __init__(self):
        self.rows = {}

    def log_metrics(self, metrics, *, step, epoch, context, **kw):
        if context == "train":
            self.rows[step] = dict(metrics)


class Keyed(Tiny):
    """Reports one uniform draw from the step's key as a loss term."""

    def loss(self, logits, *, y):
        return super().loss(logits, y=y), {"u": jax.random.uniform(nx.step_rng())}


class Dropout(Tiny):
    """Tiny with dropout on the hidden layer, keyed by step_rng()."""

    def forward(self, model, params, state, *, x):
        hidden = jax.nn.relu(x @ params["w1"] + params["b1"][None, :])
        if nx.training():
            keep = jax.random.bernoulli(nx.step_rng(), 0.5, hidden.shape)
            hidden = jnp.where(keep, hidden * 2.0, 0.0)
        return hidden @ params["w2"], state


def expected_u(seed, step, micro=0):
    raw = step_rng_input(seed, step, micro)
    key = jax.random.fold_in(
        jax.random.fold_in(jax.random.key(int(raw[0])), int(raw[1])), int(raw[2])
    )
    return float(jax.random.uniform(key))


def test_each_step_draws_the_key_folded_from_seed_and_step():
    lines = TrainLines()
    nitro = nx.Nitro(
        Keyed(max_epochs=2),
        seed=5,
        logger=lines,
        checkpointer=None,
        log_every_n_steps=1,
    )
    compiled = kinds_compiled(nitro.train)
    assert sorted(lines.rows) == list(range(1, 9))
    for step, row in lines.rows.items():  # line k reports optimizer step k - 1
        assert row["loss/u"] == pytest.approx(expected_u(5, step - 1), abs=1e-6)
    assert len({row["loss/u"] for row in lines.rows.values()}) == 8
    assert compiled.count("train_step") == 1  # the key is traced: no recompile


def test_under_accumulation_each_micro_batch_gets_its_own_key():
    lines = TrainLines()
    nitro = nx.Nitro(
        Keyed(max_epochs=1),
        logger=lines,
        checkpointer=None,
        log_every_n_steps=1,
        accum=2,
    )
    nitro.train()
    for step, row in lines.rows.items():  # the line averages the two micro-batches
        both = (expected_u(42, step - 1, 0) + expected_u(42, step - 1, 1)) / 2
        assert row["loss/u"] == pytest.approx(both, abs=1e-6)


def test_dropout_keyed_by_step_rng_resumes_exactly(tmp_path):
    straight = nx.Nitro(Dropout(max_epochs=3), logger=None, checkpointer=None)
    straight.train()
    first = nx.Nitro(Dropout(max_epochs=1), run_dir=str(tmp_path), logger=None)
    first.train()
    resumed = nx.Nitro(
        Dropout(max_epochs=3), run_dir=str(tmp_path), logger=None, resume="auto"
    )
    resumed.train()
    for a, b in zip(
        jax.tree.leaves(straight.parameters),
        jax.tree.leaves(resumed.parameters),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    reseeded = nx.Nitro(Dropout(max_epochs=3), seed=1, logger=None, checkpointer=None)
    reseeded.train()  # another seed draws other masks (and other initial weights)
    assert not np.array_equal(
        np.asarray(reseeded.parameters["w2"]), np.asarray(straight.parameters["w2"])
    )


def test_dropout_resumes_exactly_from_a_stop_partway_through_an_epoch(tmp_path):
    """Under accumulation, stopped halfway through epoch 2: the resumed run draws
    the keys of the steps and micro-batches it has not trained yet."""
    recipe = {"max_epochs": 3, "n_train": 128}  # 8 batches: 4 steps an epoch
    straight = nx.Nitro(Dropout(**recipe), accum=2, logger=None, checkpointer=None)
    straight.train()
    stopper = StopsAtStep(5)  # read back after step 6: the stop comes at step 6
    first = nx.Nitro(
        Dropout(**recipe),
        run_dir=str(tmp_path),
        accum=2,
        logger=stopper,
        log_every_n_steps=1,
        steps_per_call=1,  # the stop at the step after the read, on any backend
    )
    stopper.nitro = first
    first.train()
    assert (first.current_epoch, first.current_step) == (2, 6)
    resumed = nx.Nitro(
        Dropout(**recipe),
        run_dir=str(tmp_path),
        accum=2,
        logger=None,
        resume="auto",
    )
    resumed.train()
    assert resumed.current_step == straight.current_step == 12
    for a, b in zip(
        leaves_of(straight.parameters), leaves_of(resumed.parameters), strict=True
    ):
        np.testing.assert_array_equal(a, b)


def test_eval_programs_and_an_export_get_one_fixed_key(tmp_path):
    class AlwaysKeyed(Exportable):
        def forward(self, model, params, state, *, x):
            noise = jax.random.normal(nx.step_rng(), (x.shape[0], 1)) * 0.0
            return mlp(params, x) + noise, state

    nitro = nx.Nitro(AlwaysKeyed(max_epochs=1), logger=None, checkpointer=None)
    nitro.train()
    assert nitro.evaluate(split="val") == nitro.evaluate(split="val")
    images = np.ones((2, 8), np.float32)
    logits = nitro.predict({"x": images})
    path = nx.export_model(
        nitro, nx.StableHLOBundle(), dir=str(tmp_path), name="keyed", batch_sizes=[2]
    )
    served = nx.load_bundle(path)(x=images)["logits"]
    np.testing.assert_allclose(served, logits, rtol=1e-5, atol=1e-6)


def test_step_rng_outside_a_traced_step_is_refused_naming_the_fix():
    with pytest.raises(
        nx.HookError,
        match=r"step_rng\(\) was called outside a traced train or eval step.*"
        r"rngs=\{'dropout': nx\.step_rng\(\)\}",
    ):
        nx.step_rng()


def test_the_rng_input_wraps_a_large_seed_into_uint32():
    raw = step_rng_input(2**32 + 3, 9, 1)
    assert raw.dtype == np.uint32 and raw.tolist() == [3, 9, 1]


def test_a_manual_train_step_reads_the_same_per_step_key():
    class ManualKeyed(Tiny):
        def setup_optimizers(self, model, params, state, mesh):
            return nx.setup_optimizer(optax.sgd(0.1), params)

        def train_step(self, model, params, opt_state, state, *, x, y):
            loss, grads = nx.backward(
                lambda p, x, y: self.loss(mlp(p, x), y=y), params, x, y
            )
            opt_state, params = nx.step_optimizer(opt_state, params, grads)
            u = jax.random.uniform(nx.step_rng())
            return {
                "loss": loss,
                "params": params,
                "state": state,
                "opt_state": opt_state,
                "stats": {"u": u},
            }

    lines = TrainLines()
    nitro = nx.Nitro(
        ManualKeyed(max_epochs=1), logger=lines, checkpointer=None, log_every_n_steps=1
    )
    nitro.train()
    for step, row in lines.rows.items():
        assert row["u"] == pytest.approx(expected_u(42, step - 1), abs=1e-6)


def test_the_readme_linen_recipe_draws_dropout_from_the_step_key():
    from flax import linen as nn

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x, deterministic):
            hidden = nn.Dropout(0.5)(nn.relu(nn.Dense(16)(x)), deterministic)
            return nn.Dense(3)(hidden)

    class Linen(Tiny):
        def build_model(self, rng):
            model = Net()
            variables = model.init(rng, np.zeros((1, 8), np.float32), True)
            return model, variables["params"], {}

        def forward(self, model, params, state, *, x):  # as the README writes it
            logits = model.apply(
                {"params": params},
                x,
                deterministic=not nx.training(),
                rngs={"dropout": nx.step_rng()},
            )
            return logits, state

    class NoDropout(Linen):
        def forward(self, model, params, state, *, x):
            return model.apply({"params": params}, x, deterministic=True), state

    runs = []
    for kind in (Linen, Linen, NoDropout):
        nitro = nx.Nitro(kind(max_epochs=1), logger=None, checkpointer=None)
        nitro.train()
        runs.append(leaves_of(nitro.parameters))
    for a, b in zip(runs[0], runs[1], strict=True):  # the same keys, the same masks
        np.testing.assert_array_equal(a, b)
    assert not all(  # and the masks did drop units
        np.array_equal(a, b) for a, b in zip(runs[0], runs[2], strict=True)
    )
    x = np.ones((4, 8), np.float32)
    assert nitro.predict({"x": x}).tolist() == nitro.predict({"x": x}).tolist()


def leaves_of(tree):
    return [np.asarray(leaf) for leaf in jax.tree.leaves(tree)]
