"""Experiments for the mesh tests: batches whose sizes put padding and sharding to
the test, and a model whose large leaves divide by 4 (fsdp)."""

from __future__ import annotations

import optax
from experiments import TinyMetrics, make_batches

import jaxnitro as nx
from jaxnitro.devices import process


def quiet(**kw):
    """Keywords for a handle that writes nothing (no logger, no checkpoints)."""
    return {"logger": None, "checkpointer": None, **kw}


class Ragged(TinyMetrics):
    """Train batches of 16; val and test batches of 10 with a short last one, so
    the eval width (10) pads to 12 on 4 devices and to 10 on 2."""

    max_epochs: int = 2

    def build_data(self, dist):
        return {
            "train": make_batches(64, 16),
            "val": make_batches(25, 10, seed=1),
            "test": make_batches(13, 10, seed=2),
        }


class Wide(Ragged):
    """A hidden layer of 2048: every parameter leaf has at least 1024 elements and a
    dimension that divides by 4, so fsdp splits the whole model."""

    width: nx.GraphConst[int] = 2048
    max_epochs: int = 1

    def learning_rate(self, group=None):
        return 0.01


def unpinned(monkeypatch):
    """Run the test with no setup_devices choices, restoring them afterwards."""
    monkeypatch.setattr(process, "_SETUP", process.DeviceSetup())


MESHES: list = []  # what each ManualRagged setup_optimizers call received


class ManualRagged(Ragged):
    """Ragged trained by its own train_step, one SGD optimizer; it records the mesh
    setup_optimizers receives."""

    def setup_optimizers(self, model, params, state, mesh):
        MESHES.append(mesh)
        return {"all": nx.setup_optimizer(optax.sgd(0.05), params)}

    def train_step(self, model, params, opt_state, state, *, x, y):
        def objective(p):
            logits, _ = self.forward(model, p, state, x=x)
            return self.loss(logits, y=y)

        loss, grads = nx.backward(objective, params)
        opt, params = nx.step_optimizer(opt_state["all"], params, grads)
        return {
            "loss": loss,
            "params": params,
            "state": state,
            "opt_state": {"all": opt},
            "stats": {},
        }
