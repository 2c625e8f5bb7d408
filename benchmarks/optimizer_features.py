"""Throughput with the optimizer's features on, against a hand-written loop doing the
same math: two parameter groups (the first layer at a tenth of the rate), decoupled
decay of that group toward its initial weights (L2-SP), global-norm clipping and an EMA
of the weights, on the tutorial-sized MLP (784-128-10, batch 100).

    python benchmarks/optimizer_features.py
    python benchmarks/optimizer_features.py --reps 5    # fewer epoch pairs
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import optax
from _common import (
    WORKLOADS,
    apply,
    banner,
    cross_entropy,
    init_params,
    make_experiment,
    paired_ratio,
    synthetic_batches,
)

import jaxnitro as nx

LR, RATIO, DECAY, CLIP, BETA = 1e-3, 0.1, 1e-4, 1.0, 0.999


def experiment(widths, batches):
    """The shared benchmark experiment with the optimizer's features turned on."""

    class Featured(make_experiment(widths, batches)):
        def param_group(self, keypath):
            return "encoder" if keypath[0] == 0 else "default"

        def learning_rate(self, group=None):
            return LR * RATIO if group == "encoder" else LR

        def weight_decay(self, group=None):
            return DECAY if group == "encoder" else 0.0

        def decay_anchor(self, group=None):
            return "w0"

        def gradient_clip_norm(self):
            return CLIP

        def ema(self):
            return nx.EMA(BETA)

    return Featured


def hand_written(widths, batches):
    """The same math as one jitted step, written directly with Optax."""
    params = init_params(widths)
    w0 = jax.tree.map(jnp.array, params)
    labels = ["encoder" if i == 0 else "default" for i in range(len(params))]
    labels = [{"w": label, "b": label} for label in labels]

    def decay_to_w0(coefficient):
        def init(p):
            return optax.EmptyState()

        def update(u, s, p):
            def pull(ui, pi, ai, keep):
                if isinstance(ui, optax.MaskedNode) or not keep:
                    return ui  # another group's leaf, or a 1-D one
                return ui - coefficient * (pi - ai)

            keep = [{"w": True, "b": False} for _ in params]  # 1-D leaves never decay
            return jax.tree.map(
                pull, u, p, w0, keep, is_leaf=lambda x: isinstance(x, optax.MaskedNode)
            ), s

        return optax.GradientTransformation(init, update)

    tx = optax.chain(
        optax.clip_by_global_norm(CLIP),
        optax.multi_transform(
            {
                "default": optax.radam(LR),
                "encoder": optax.chain(
                    optax.radam(LR * RATIO), decay_to_w0(DECAY * LR * RATIO)
                ),
            },
            labels,
        ),
    )

    def step(p, o, ema, t, x, y):
        loss, g = jax.value_and_grad(lambda q: cross_entropy(apply(q, x), y))(p)
        u, o = tx.update(g, o, p)
        p = optax.apply_updates(p, u)
        d = jnp.minimum(BETA, (1 + t) / (10 + t))
        ema = jax.tree.map(lambda a, q: d * a + (1 - d) * q, ema, p)
        return p, o, ema, loss

    jitted = jax.jit(step, donate_argnums=(0, 1, 2))
    state = {"p": params, "o": tx.init(params), "ema": jax.tree.map(jnp.array, params)}
    state["t"] = 0

    def run_epoch():
        loss = None
        for b in batches:
            state["p"], state["o"], state["ema"], loss = jitted(
                state["p"], state["o"], state["ema"], state["t"], b["x"], b["y"]
            )
            state["t"] += 1
        loss.block_until_ready()

    return run_epoch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=25, help="epoch pairs")
    reps = parser.parse_args().reps
    print(banner())
    widths, batch, count = WORKLOADS["tutorial_mlp"]
    batches = synthetic_batches(batch, count)
    exp = experiment(widths, batches)
    reference = hand_written(widths, batches)
    reference()

    def ours():
        nitro = nx.Nitro(exp(max_epochs=2), logger=None, checkpointer=None)
        nitro.train()
        return nitro.history[2]["seconds"]  # epoch 2: no compile in it

    ours()
    mine, theirs = [], []
    for _ in range(reps):  # one epoch each, interleaved: paired samples
        mine.append(ours())
        start = time.perf_counter()
        reference()
        theirs.append(time.perf_counter() - start)
    ratio = paired_ratio(theirs, mine)
    print(
        f"two groups + decay toward w0 + clipping + EMA, tutorial MLP: "
        f"jaxnitro/hand-written = {ratio:.3f}x paired (s/epoch: jaxnitro "
        f"{statistics.median(mine):.4f}, hand-written "
        f"{statistics.median(theirs):.4f})"
    )


if __name__ == "__main__":
    main()
