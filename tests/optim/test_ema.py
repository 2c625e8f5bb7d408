"""EMA: it tracks the weights, evaluation reads it, it is checkpointed and resumed."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from experiments import Tiny, mlp
from optim_reference import (
    BATCH,
    OneBatch,
    assert_trees_close,
    initial_params,
    loss_of,
    quiet,
)

import jaxnitro as nx


def test_ema_tracks_the_weights_and_is_what_evaluation_reads(tmp_path):
    nitro = nx.Nitro(OneBatch(max_epochs=4), ema=nx.EMA(0.9), **quiet())
    history = []
    params = initial_params()
    expected = params
    tx = optax.radam(0.05)
    state = tx.init(params)
    for t in range(4):
        grads = jax.grad(lambda p: loss_of(Tiny(), p, BATCH))(params)
        updates, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, updates)
        d = min(0.9, (1 + t) / (10 + t))
        expected = jax.tree.map(lambda a, p, d=d: d * a + (1 - d) * p, expected, params)
        history.append(d)
    nitro.train()
    assert_trees_close(nitro.train_state.ema, expected)
    assert_trees_close(nitro.parameters, params)
    out = nitro.predict({"x": BATCH["x"]})
    np.testing.assert_allclose(
        out, np.asarray(mlp(expected, jnp.asarray(BATCH["x"]))), rtol=1e-5
    )


def test_ema_is_checkpointed_resumed_and_loadable(tmp_path):
    kw = {"run_dir": str(tmp_path), "logger": None, "ema": nx.EMA(0.9)}
    straight = nx.Nitro(Tiny(max_epochs=3), **kw)
    straight.train()
    (tmp_path / "b").mkdir()
    kw_b = {**kw, "run_dir": str(tmp_path / "b")}
    nx.Nitro(Tiny(max_epochs=1), **kw_b).train()
    resumed = nx.Nitro(Tiny(max_epochs=3), resume="auto", **kw_b)
    resumed.train()
    for a, b in zip(
        jax.tree.leaves(resumed.train_state.ema),
        jax.tree.leaves(straight.train_state.ema),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    newest = max(nx.read_manifest(str(tmp_path)), key=lambda e: e.epoch)
    loaded = nx.Nitro(
        Tiny(),
        weights=str(tmp_path / newest.file),
        load_ema=True,
        **{"logger": None, "checkpointer": None},
    )
    assert_trees_close(loaded.parameters, straight.train_state.ema, rtol=0, atol=0)
    with pytest.raises(nx.ConfigError, match='eval_weights="ema" needs an EMA'):
        nx.Nitro(Tiny(), eval_weights="ema", **quiet())
