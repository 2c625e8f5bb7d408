"""The training state is one typed value: what the handle holds, what the programs
take and return, and what they donate."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from experiments import StopsAtStep, Tiny

import jaxnitro as nx
from jaxnitro.compile.boundary import StepOutputs, Weights
from jaxnitro.compile.packed import ACCELERATOR_PACKING
from jaxnitro.loop import calls
from jaxnitro.loop.state import TrainState


def quiet(**kw):
    return {"logger": None, "checkpointer": None, **kw}


def test_setup_holds_the_built_weights_and_no_optimizer_state_yet():
    nitro = nx.Nitro(Tiny(), **quiet())
    state = nitro.train_state
    assert isinstance(state, TrainState) and isinstance(state.weights, Weights)
    assert (state.step, state.epoch) == (0, 0)
    assert state.opt_state is None and state.ema is None and state.accumulator is None
    assert state.params is nitro.parameters
    assert state.model_state is nitro.states


@pytest.mark.parametrize("accum", [1, 2])
def test_a_step_donates_the_weights_it_replaces_and_keeps_the_model_state(accum):
    stopper = StopsAtStep(1)
    nitro = nx.Nitro(
        Tiny(max_epochs=2),
        accum=accum,
        ema=nx.EMA(0.9),
        logger=stopper,
        checkpointer=None,
        log_every_n_steps=1,
    )
    stopper.nitro = nitro
    nitro.train()  # stops once the train line of step 1 is read back
    stopped = nitro.train_state
    assert stopped.step == 2 and stopped.epoch == 1  # it ran one step ahead
    assert stopped.opt_state is not None and stopped.ema is not None
    assert (stopped.accumulator is None) == (accum == 1)
    nitro.train()  # continues the same run from the state the handle holds
    after = nitro.train_state
    assert (after.step, after.epoch) == (4 // accum * 2, 2)
    # The Weights (and the accumulator) are donated: the stopped state's buffers
    # are gone; the model state is not donated, and the newest state is whole.
    donated = jax.tree.leaves((stopped.weights, stopped.accumulator))
    assert donated and all(leaf.is_deleted() for leaf in donated)
    assert all(not leaf.is_deleted() for leaf in jax.tree.leaves(after.weights))


def test_a_warm_start_copies_and_leaves_the_source_state_whole():
    source = nx.Nitro(Tiny(max_epochs=1), **quiet())
    source.train()
    held = source.train_state
    started = nx.Nitro(Tiny(max_epochs=1), weights=source, **quiet())
    np.testing.assert_array_equal(started.parameters["w1"], held.params["w1"])
    started.train()
    assert all(not leaf.is_deleted() for leaf in jax.tree.leaves(held.weights))
    assert source.train_state is held


@pytest.mark.parametrize("packed", [False, True])
def test_the_programs_return_typed_outputs(monkeypatch, packed):
    """The train program returns (Weights, model state, accumulator, StepOutputs,
    ring), not a flat tuple of arrays: read off the compiled program the loop ran.
    Unpacked (a large state's path), the Weights come back as a tree; packed (a
    small one's), as one flat buffer per dtype in the Weights' place."""
    monkeypatch.setattr(
        calls, "pack_rule", lambda: ACCELERATOR_PACKING if packed else None
    )
    nitro = nx.Nitro(Tiny(max_epochs=1), **quiet())
    nitro.train()
    state = nitro.train_state
    (kind, program), *_ = nitro.executables.compiled()
    weights, model_state, accumulator, reported, ring = program.out_info
    assert kind == "train_step"
    assert isinstance(reported, StepOutputs)
    if packed:
        flat = jax.tree.leaves(state.weights)
        assert isinstance(weights, tuple) and model_state == accumulator == ()
        assert sum(w.size for w in weights) == sum(leaf.size for leaf in flat)
        return
    assert isinstance(weights, Weights)
    assert jax.tree.structure(weights.params) == jax.tree.structure(state.params)
    assert reported.loss is None  # each loss travels in the ring, not twice
    assert ring.dtype == np.uint32 and accumulator is None
