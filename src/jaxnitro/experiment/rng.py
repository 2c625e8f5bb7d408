"""A per-step random key for traced hooks: `jaxnitro.step_rng()`.

Dropout needs a fresh key every step, and an exact resume needs step k's key to be
the same whether the run was stopped or not. The train programs therefore take one
small input per micro-batch, `uint32[3]` = (run seed, global optimizer step,
micro-batch index), and `step_rng()` folds it into a key while the hook is traced.
The input is traced, so a new step compiles nothing; the key is a pure function of
(seed, step, micro-batch), so a resumed run draws the same keys as a straight one.

Evaluation programs run the model in eval mode, where dropout is off: there
`step_rng()` returns one fixed key, so a forward that always passes a key still
traces.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np

from ..errors import HookError

_STEP_RNG: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "jaxnitro_step_rng", default=None
)

EVAL_RNG_INPUT = np.zeros(3, np.uint32)
"""The eval programs' rng input: one fixed key (eval mode draws no dropout)."""

OUTSIDE_STEP = (
    "jaxnitro.step_rng() was called outside a traced train or eval step. It returns "
    "the key of the step being traced, so call it inside a hook the programs trace "
    "(forward, loss, train_metrics, metrics), e.g. `rngs={{'dropout': "
    "nx.step_rng()}}` in forward. {where}"
)


def step_rng() -> jax.Array:
    """The random key of the train step being traced (a typed `jax.random.key`).

    Folded from the run seed, the global optimizer step and, under gradient
    accumulation, the micro-batch index, so dropout is reproducible and a resumed
    run draws exactly the keys an uninterrupted one would. Every call within one
    step returns the same key: split it (`jax.random.split`) for several uses, or
    hand it to a library that derives its own streams (Linen's
    `rngs={"dropout": key}`, NNX's `nnx.Rngs(dropout=key)`). In eval programs it
    returns one fixed key.

    Raises:
        HookError: called outside a traced train or eval step.

    Example, in a Flax Linen forward:

        def forward(self, model, params, state, *, img):
            logits = model.apply({"params": params}, img,
                                 deterministic=not nx.training(),
                                 rngs={"dropout": nx.step_rng()})
            return logits, state
    """
    raw = _STEP_RNG.get()
    if raw is None:
        raise HookError(OUTSIDE_STEP.format(where="No step is being traced now."))
    key = jax.random.key(raw[0])
    return jax.random.fold_in(jax.random.fold_in(key, raw[1]), raw[2])


@contextlib.contextmanager
def step_rng_scope(raw: Any) -> Iterator[None]:
    """Make `step_rng()` fold `raw` (uint32[3], traced) while a program is traced."""
    token = _STEP_RNG.set(raw)
    try:
        yield
    finally:
        _STEP_RNG.reset(token)


def step_rng_input(seed: int, step: int, micro: int = 0) -> np.ndarray:
    """The train programs' rng input for optimizer step `step` (0-based, global)
    and micro-batch `micro` of it: uint32[3] (seed mod 2**32, step, micro).

    >>> step_rng_input(42, 7, 1)
    array([42,  7,  1], dtype=uint32)
    """
    return np.array([seed % 2**32, step % 2**32, micro], np.uint32)
