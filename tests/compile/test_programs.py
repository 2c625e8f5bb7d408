"""One tiny MLP classifier written with Flax Linen, Flax NNX and Equinox.

Each version trains through the same four hooks. The idioms:

- Linen: `build_model` returns `(module, variables["params"], batch_stats or {})`;
  `forward` calls `module.apply`, with `mutable=["batch_stats"]` in train mode only.
- NNX: `nnx.split(model, nnx.Param, ...)` gives `(graphdef, params, rest)`; `forward`
  merges a copy (`nnx.merge(..., copy=True)`, safe inside `jax.grad`), switches the copy
  to `train()` or `eval()` from `jaxnitro.training()`, and returns the non-Param state
  `nnx.state(m, nnx.Not(nnx.Param))`, the same structure as `rest`.
- Equinox: `eqx.partition(model, eqx.is_array)` gives `(params, static)`; `forward`
  calls `eqx.combine(params, static)` per sample under `jax.vmap`.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from experiments import N_CLASSES, N_FEATURES, make_batches
from flax import linen as nn
from flax import nnx

import jaxnitro as nx


def quiet(**kw):
    return {"logger": None, "checkpointer": None, **kw}


class Base(nx.Experiment):
    """4 train batches of 16, 2 val batches; the model comes from the subclass."""

    width: nx.GraphConst[int] = 16
    max_epochs: int = 10

    def build_data(self, dist):
        return {"train": make_batches(64, 16), "val": make_batches(24, 16, seed=1)}

    def loss(self, logits, *, y):
        return -jnp.mean(jnp.sum(y * jax.nn.log_softmax(logits), -1))

    def learning_rate(self, group=None):
        return 0.05


# ---------------------------------------------------------------- Flax Linen -----
class LinenNet(nn.Module):
    width: int
    batchnorm: bool = False

    @nn.compact
    def __call__(self, x, train: bool = False):
        h = nn.Dense(self.width)(x)
        if self.batchnorm:
            h = nn.BatchNorm(use_running_average=not train)(h)
        return nn.Dense(N_CLASSES)(nn.relu(h))


class LinenMLP(Base):
    def build_model(self, rng):
        module = LinenNet(self.width)
        variables = module.init(rng, jnp.zeros((1, N_FEATURES)))
        return module, variables["params"], {}

    def forward(self, model, params, state, *, x):
        return model.apply({"params": params}, x), state


class LinenBatchNorm(Base):
    def build_model(self, rng):
        module = LinenNet(self.width, batchnorm=True)
        variables = module.init(rng, jnp.zeros((1, N_FEATURES)))
        return module, variables["params"], variables["batch_stats"]

    def forward(self, model, params, state, *, x):
        variables = {"params": params, "batch_stats": state}
        if nx.training():
            logits, updates = model.apply(
                variables, x, train=True, mutable=["batch_stats"]
            )
            return logits, updates["batch_stats"]
        return model.apply(variables, x, train=False, mutable=False), state


# ------------------------------------------------------------------ Flax NNX -----
class NNXNet(nnx.Module):
    def __init__(self, width, *, rngs):
        self.hidden = nnx.Linear(N_FEATURES, width, rngs=rngs)
        self.norm = nnx.BatchNorm(width, rngs=rngs)
        self.out = nnx.Linear(width, N_CLASSES, rngs=rngs)

    def __call__(self, x):
        return self.out(nnx.relu(self.norm(self.hidden(x))))


class NNXBatchNorm(Base):
    def build_model(self, rng):
        graphdef, params, rest = nnx.split(
            NNXNet(self.width, rngs=nnx.Rngs(rng)), nnx.Param, ...
        )
        return graphdef, params, rest

    def forward(self, model, params, state, *, x):
        m = nnx.merge(model, params, state, copy=True)
        if nx.training():
            m.train()  # BatchNorm normalizes with batch statistics and updates them
        else:
            m.eval()  # BatchNorm normalizes with its running statistics
        return m(x), nnx.state(m, nnx.Not(nnx.Param))


# ------------------------------------------------------------------- Equinox -----
class EqxMLP(Base):
    def build_model(self, rng):
        model = eqx.nn.MLP(N_FEATURES, N_CLASSES, self.width, depth=1, key=rng)
        params, static = eqx.partition(model, eqx.is_array)
        return static, params, {}

    def forward(self, model, params, state, *, x):
        return jax.vmap(eqx.combine(params, model))(x), state


ALL = [LinenMLP, LinenBatchNorm, NNXBatchNorm, EqxMLP]
BATCHNORM = [LinenBatchNorm, NNXBatchNorm]
X = make_batches(10, 10, seed=3)[0]["x"]


def host(tree):
    return [np.array(leaf) for leaf in jax.tree.leaves(tree)]


@pytest.mark.parametrize("cls", ALL)
def test_trains_predicts_and_recompiles_nothing_for_an_equal_experiment(cls):
    nitro = nx.Nitro(cls(), **quiet()).train()
    losses = [row["loss"] for row in nitro.history]
    assert len(losses) == 10 and losses[-1] < 0.9 * losses[0]
    assert losses == sorted(losses, reverse=True)  # the validation loss falls
    out = nitro.predict({"x": X})
    assert isinstance(out, np.ndarray) and out.shape == (10, N_CLASSES)
    assert np.isfinite(out).all()

    before = nx.cache_stats()
    again = nx.Nitro(cls(), **quiet()).train()
    after = nx.cache_stats()
    assert after["misses"] == before["misses"] and after["hits"] > before["hits"]
    assert [row["loss"] for row in again.history] == pytest.approx(losses, rel=1e-5)


@pytest.mark.parametrize("cls", ALL)
def test_validate_on_a_never_trained_handle(cls):
    nitro = nx.Nitro(cls(), **quiet())
    result = nitro.validate()
    assert set(result) == {"loss"} and np.isfinite(result["loss"])
    assert nitro.current_step == 0


@pytest.mark.parametrize("cls", BATCHNORM)
def test_batchnorm_state_trains_and_eval_uses_the_running_statistics(cls):
    nitro = nx.Nitro(cls(max_epochs=2), **quiet())
    initial = host(nitro.states)
    assert initial, "the BatchNorm statistics are the state"
    nitro.train()
    trained = host(nitro.states)
    assert len(trained) == len(initial)
    assert all(not np.allclose(a, b) for a, b in zip(initial, trained, strict=True))

    first = nitro.predict({"x": X})
    np.testing.assert_array_equal(nitro.predict({"x": X}), first)
    # Running statistics make each sample's output independent of its batch.
    np.testing.assert_allclose(nitro.predict({"x": X[:3]}), first[:3], rtol=1e-5)
    nitro.validate()
    for a, b in zip(host(nitro.states), trained, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("cls", ALL)
def test_a_checkpoint_round_trip_gives_the_same_validation_loss(cls, tmp_path):
    nitro = nx.Nitro(cls(max_epochs=2), run_dir=str(tmp_path), logger=None).train()
    expected = nitro.validate()["loss"]
    newest = max(nx.read_manifest(str(tmp_path)), key=lambda e: (e.step, e.written))
    loaded = nx.Nitro(cls(), weights=str(tmp_path / newest.file), **quiet())
    assert loaded.validate()["loss"] == pytest.approx(expected, rel=1e-6)
    for a, b in zip(host(loaded.states), host(nitro.states), strict=True):
        np.testing.assert_array_equal(a, b)
