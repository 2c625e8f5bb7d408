"""Tiny experiments and data shared by the tests: fast to compile, real to train."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import jaxnitro as nx

N_FEATURES = 8
N_CLASSES = 3


def make_batches(n: int, batch: int, *, seed: int = 0, extra: bool = False) -> list:
    """A linearly separable 3-class problem as a list of batch dicts."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, N_FEATURES)).astype(np.float32)
    w = np.random.default_rng(99).normal(size=(N_FEATURES, N_CLASSES))
    labels = (x @ w).argmax(-1)
    y = np.eye(N_CLASSES, dtype=np.float32)[labels]
    batches = []
    for start in range(0, n, batch):
        b = {"x": x[start : start + batch], "y": y[start : start + batch]}
        if extra:
            b["name"] = np.array([f"s{i}" for i in range(start, start + len(b["x"]))])
        batches.append(b)
    return batches


def samples(n: int, seed: int = 0) -> list:
    """The same problem as single samples (dicts of one row each), for Grain."""
    batch = make_batches(n, n, seed=seed)[0]
    return [{"x": x, "y": y} for x, y in zip(batch["x"], batch["y"], strict=True)]


def init_mlp(rng, width: int) -> dict:
    k1, k2 = jax.random.split(rng)
    return {
        "w1": jax.random.normal(k1, (N_FEATURES, width)) * 0.3,
        "b1": jnp.zeros(width),
        "w2": jax.random.normal(k2, (width, N_CLASSES)) * 0.3,
    }


def mlp(params, x):
    return jax.nn.relu(x @ params["w1"] + params["b1"][None, :]) @ params["w2"]


class Tiny(nx.Experiment):
    """A two-layer MLP on a 3-class problem: 4 train batches of 16, 2 val batches."""

    width: nx.GraphConst[int] = 16
    """Hidden width. Structural: changes the compiled graph."""

    smoothing: nx.Device[float] = 0.0
    """Label smoothing, a traced input."""

    temperature: nx.Device[float] = 1.0
    """Softmax temperature, swept at inference."""

    n_train: int = 64
    max_epochs: int = 2

    def build_data(self, dist):
        return {
            "train": make_batches(self.n_train, 16),
            "val": make_batches(24, 16, seed=1),
            "test": make_batches(40, 16, seed=2),
        }

    def build_model(self, rng):
        return None, init_mlp(rng, self.width), {}

    def forward(self, model, params, state, *, x):
        return mlp(params, x) / self.temperature, state

    def loss(self, logits, *, y):
        target = (1 - self.smoothing) * y + self.smoothing / N_CLASSES
        return -jnp.mean(jnp.sum(target * jax.nn.log_softmax(logits), -1))

    def learning_rate(self, group=None):
        return 0.05


class HostBuilt(Tiny):
    """Tiny with NumPy parameters: its hooks compile nothing at setup."""

    def build_model(self, rng):
        g = np.random.default_rng(0)
        return (
            None,
            {
                "w1": g.normal(size=(N_FEATURES, self.width)).astype(np.float32),
                "b1": np.zeros(self.width, np.float32),
                "w2": g.normal(size=(self.width, N_CLASSES)).astype(np.float32),
            },
            {},
        )


class TinyMetrics(Tiny):
    """Tiny with accuracy and a summed confusion matrix."""

    def metrics(self, logits, *, y):
        pred, truth = np.argmax(logits, -1), np.argmax(y, -1)
        confusion = np.zeros((N_CLASSES, N_CLASSES))
        np.add.at(confusion, (truth, pred), 1)
        return {"acc": ((pred == truth).sum(), len(y)), "confusion": (confusion, "sum")}

    def monitor(self):
        return ("acc", "max")


class TinyTrainAcc(Tiny):
    """Tiny with a device train_metrics: each step's train accuracy."""

    def train_metrics(self, logits, *, y):
        return {"train_acc": jnp.mean(logits.argmax(-1) == y.argmax(-1))}


class QuietLogger(nx.logging.Logger):
    """A logger whose verbs do nothing (the protocol's bodies, inherited by naming it
    as a base): subclass it and override what a test reads."""


class StopsAtStep(QuietLogger):
    """Requests a stop at one train line (a user's Ctrl+C, or a monitor); set
    `.nitro` to the handle once it is built."""

    def __init__(self, step):
        self.step, self.nitro = step, None

    def log_metrics(self, metrics, *, step, epoch, context, **kw):
        if context == "train" and step == self.step:
            self.nitro.request_stop()
