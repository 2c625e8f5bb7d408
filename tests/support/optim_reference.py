"""The optimizer tests' shared cases: a one-batch experiment, and the hand-written
Optax loop each formula is checked against.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from experiments import Tiny, make_batches, mlp

import jaxnitro as nx


def quiet(**kw):
    return {"logger": None, "checkpointer": None, **kw}


class OneBatch(Tiny):
    """Tiny with one train batch of 16 and no val split: one step per epoch."""

    def build_data(self, dist):
        return {"train": make_batches(16, 16)}


def loss_of(e, params, batch):
    return Tiny.loss(e, mlp(params, jnp.asarray(batch["x"])), y=jnp.asarray(batch["y"]))


def reference(tx, steps, batch, params0, smoothing=0.0):
    """Run `steps` steps of a hand-written Optax loop from `params0`."""
    e = Tiny(smoothing=smoothing)
    params, state = params0, tx.init(params0)
    for _ in range(steps):
        grads = jax.grad(lambda p: loss_of(e, p, batch))(params)
        updates, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, updates)
    return params


def initial_params(width=16, seed=42):
    from experiments import init_mlp

    return init_mlp(jax.random.key(seed), width)


def assert_trees_close(a, b, rtol=2e-5, atol=1e-6):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


BATCH = make_batches(16, 16)[0]


class Grouped(OneBatch):
    """Two groups: the first layer is the encoder at a tenth of the rate, decayed."""

    def param_group(self, keypath):
        return "encoder" if keypath[0] in ("w1", "b1") else "default"

    def learning_rate(self, group=None):
        return 0.01 if group == "encoder" else 0.1

    def weight_decay(self, group=None):
        return 0.5 if group == "encoder" else 0.0


class Level2(OneBatch):
    def optimizer(self, group, hp):
        return optax.chain(
            optax.sgd(hp["learning_rate"], momentum=hp["momentum"]),
            nx.Decay(hp["weight_decay"], hp["anchor"], hp["no_decay_mask"]),
        )

    def weight_decay(self, group=None):
        return 0.1
