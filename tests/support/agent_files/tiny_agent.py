"""An experiment file the agent tests copy under a server root: self-contained (the
server imports it by path), a two-layer MLP on a 3-class problem with export hooks.

`Slow` trains long enough (many small steps) for a test to see it stepping and stop
it; `Broken` fails inside its first training step."""

import jax
import jax.numpy as jnp
import numpy as np

import jaxnitro as nx


def batches(n, batch, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 8)).astype(np.float32)
    w = np.random.default_rng(99).normal(size=(8, 3))
    y = np.eye(3, dtype=np.float32)[(x @ w).argmax(-1)]
    return [{"x": x[s : s + batch], "y": y[s : s + batch]} for s in range(0, n, batch)]


class TinyAgent(nx.Experiment):
    width: nx.GraphConst[int] = nx.field(default=8, ge=1)
    lr: float = 0.05
    n_train: int = 32
    max_epochs: int = 2

    @classmethod
    def presets(cls):
        return {"wide": {"width": 16}}

    def build_data(self, dist):
        return {
            "train": batches(self.n_train, 8, 0),
            "val": batches(16, 8, 1),
            "test": batches(16, 8, 2),
        }

    def build_model(self, rng):
        k1, k2 = jax.random.split(rng)
        params = {
            "w1": jax.random.normal(k1, (8, self.width)) * 0.3,
            "w2": jax.random.normal(k2, (self.width, 3)) * 0.3,
        }
        return None, params, {}

    def forward(self, model, params, state, *, x):
        return jax.nn.relu(x @ params["w1"]) @ params["w2"], state

    def loss(self, logits, *, y):
        return -jnp.mean(jnp.sum(y * jax.nn.log_softmax(logits), -1))

    def export_inputs(self):
        return [nx.ExportSpec("x", "float32", (1, 8))]

    def export_outputs(self):
        return [nx.ExportSpec("logits")]


class Slow(TinyAgent):
    n_train: int = 2048
    max_epochs: int = 50


class Broken(TinyAgent):
    def loss(self, logits, *, y):
        raise RuntimeError("loss exploded on purpose")
