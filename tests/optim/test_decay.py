"""Decoupled decay: toward zero, toward the initial weights (L2-SP) or a tree, the
no-decay mask, what a zero decay emits, and the anchors a resume must match.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from experiments import Tiny
from optim_reference import (
    BATCH,
    OneBatch,
    assert_trees_close,
    initial_params,
    quiet,
    reference,
)

import jaxnitro as nx
from jaxnitro.compile.boundary import Weights
from jaxnitro.compile.cache import program_cache


def test_decay_toward_w0_is_l2_sp():
    class Anchored(OneBatch):
        def weight_decay(self, group=None):
            return 0.3

        def decay_anchor(self, group=None):
            return "w0"

        def no_decay(self, keypath, leaf):
            return False  # decay every leaf, biases included

        def learning_rate(self, group=None):
            return 0.05

    nitro = nx.Nitro(Anchored(max_epochs=3), **quiet())
    w0 = initial_params()
    nitro.train()

    def init(params):  # by hand: update -= lam * lr * (w - w0)
        return optax.EmptyState()

    def update(updates, state, params):
        return jax.tree.map(
            lambda u, p, a: u - 0.3 * 0.05 * (p - a), updates, params, w0
        ), state

    tx = optax.chain(optax.radam(0.05), optax.GradientTransformation(init, update))
    expected = reference(tx, 3, BATCH, w0)
    assert_trees_close(nitro.parameters, expected)
    assert "default" in nitro.prepared.anchor_sums


def test_no_decay_mask_changes_compile_nothing():
    class Decayed(OneBatch):
        decay_biases: bool = False  # Host: a new value is the same program

        def weight_decay(self, group=None):
            return 0.1

        def no_decay(self, keypath, leaf):
            return nx.optim.default_no_decay(keypath, leaf) and not self.decay_biases

    first = nx.Nitro(Decayed(max_epochs=3), **quiet())
    first.train()
    before = nx.cache_stats()["misses"]
    second = nx.Nitro(Decayed(max_epochs=3, decay_biases=True), **quiet())
    second.train()
    assert nx.cache_stats()["misses"] == before
    assert float(first.prepared.plan.groups[0].mask["b1"]) == 0.0
    assert float(second.prepared.plan.groups[0].mask["b1"]) == 1.0
    # The biases start at zero, so decay moves them from the second step on.
    assert not np.array_equal(first.parameters["b1"], second.parameters["b1"])


def lowered_step(plan, params, by_hand=False):
    """The stablehlo lines of one optimizer step, from the plan or written by hand.

    By hand: RAdam on the step's inputs, then (if the plan decays)
    `u - mask * (lambda * w)`, decay toward zero with no anchor term at all.
    """

    def step(p, state, grads, hp):
        if not by_hand:
            return plan.apply(None, Weights(p, state, None), grads, hp)[:2]
        group = hp.groups["default"]

        def decay_update(updates, state, p):
            def pull(u, w, m):
                return u - (m * (group["weight_decay"] * w)).astype(u.dtype)

            return jax.tree.map(pull, updates, p, group["no_decay_mask"]), state

        # The rule's float fields are inputs too, scheduled or not.
        fields = {name: group[name] for name in plan.groups[0].scheduled}
        tx = optax.radam(group["learning_rate"], **fields)
        if plan.groups[0].decays:
            decay = optax.GradientTransformation(
                lambda p: optax.EmptyState(), decay_update
            )
            tx = optax.chain(tx, decay)
        updates, state = tx.update(grads, state, p)
        new = jax.tree.map(lambda a, u: (a + u).astype(a.dtype), p, updates)
        return new, state

    args = (params, plan.init_state(params), params, plan.step_inputs(0))
    text = jax.jit(step).lower(*args).as_text()
    return [line for line in text.splitlines() if "stablehlo." in line]


def test_zero_decay_emits_no_decay_and_zero_anchor_no_subtraction():
    class Decayed(OneBatch):
        def weight_decay(self, group=None):
            return 0.1

    nx.compile.cache_reset()
    plain = nx.Nitro(OneBatch(max_epochs=1), **quiet())
    decayed = nx.Nitro(Decayed(max_epochs=1), **quiet())
    plain.train()
    decayed.train()
    keys = [k for k in program_cache().program_keys() if k.kind == "train_step"]
    assert len(keys) == 2
    assert len({k.baked for k in keys}) == 2  # decay is part of the program's key
    assert not plain.prepared.plan.groups[0].decays
    assert (
        decayed.prepared.plan.groups[0].decays
        and decayed.prepared.plan.groups[0].anchor is None
    )

    params = initial_params()
    # Zero decay: exactly the bare rule's program, no decay ops at all.
    bare = lowered_step(plain.prepared.plan, params)
    assert bare == lowered_step(plain.prepared.plan, params, by_hand=True)
    # Decay toward zero: exactly `u - mask * (lambda * w)`, no `w - anchor`.
    toward_zero = lowered_step(decayed.prepared.plan, params)
    assert toward_zero == lowered_step(decayed.prepared.plan, params, by_hand=True)
    # An explicit (all-zero) anchor tree does emit the subtraction, once per leaf.
    group = dataclasses.replace(
        decayed.prepared.plan.groups[0], anchor=jax.tree.map(jnp.zeros_like, params)
    )
    anchored = lowered_step(
        dataclasses.replace(decayed.prepared.plan, groups=(group,)), params
    )

    def subtractions(lines):
        return sum("stablehlo.subtract" in line for line in lines)

    leaves = len(jax.tree.leaves(params))
    assert subtractions(toward_zero) == subtractions(bare) + leaves  # u - step
    assert subtractions(anchored) == subtractions(toward_zero) + leaves  # w - anchor


def test_resume_refuses_a_different_decay_anchor(tmp_path):
    class Anchored(Tiny):
        def weight_decay(self, group=None):
            return 0.1

        def decay_anchor(self, group=None):
            return "w0"

    kw = {"run_dir": str(tmp_path), "logger": None}
    nx.Nitro(Anchored(max_epochs=1), **kw).train()
    nx.Nitro(Anchored(max_epochs=2), resume="auto", **kw).train()  # same anchor: fine
    zeros = jax.tree.map(jnp.zeros_like, initial_params())
    with pytest.raises(nx.ConfigError, match="decays toward an anchor that differs"):
        nx.Nitro(Anchored(max_epochs=3), resume="auto", w0=zeros, **kw)


def test_resuming_an_l2_sp_run_names_the_w0_tree_it_needs(tmp_path):
    class Anchored(Tiny):
        def weight_decay(self, group=None):
            return 0.1

        def decay_anchor(self, group=None):
            return "w0"

    source = str(tmp_path / "source")
    nx.Nitro(Tiny(max_epochs=1, n_train=16), run_dir=source, logger=None).train()
    weights = str(tmp_path / "source" / nx.read_manifest(source)[-1].file)
    kw = {"run_dir": str(tmp_path / "tuned"), "logger": None}
    nx.Nitro(Anchored(max_epochs=1), weights=weights, w0="weights", **kw).train()
    with pytest.raises(
        nx.ConfigError,
        match=r'w0="weights" .* a resume takes no weights=.* pass the transferred '
        r"tree itself as w0=<tree>, e\.g\. w0=Nitro\(e, weights=",
    ):
        nx.Nitro(Anchored(max_epochs=2), resume="auto", w0="weights", **kw)
    with pytest.raises(
        nx.ConfigError,
        match=r'checksum mismatch.* a run trained with w0="weights" \(L2-SP\) or '
        r"w0=<tree> resumes with that tree passed as w0=<tree>",
    ):
        nx.Nitro(Anchored(max_epochs=2), resume="auto", **kw)
    tree = nx.Nitro(Tiny(), weights=weights, **quiet()).parameters
    resumed = nx.Nitro(Anchored(max_epochs=2), resume="auto", w0=tree, **kw)
    assert resumed.current_epoch == 1


def test_w0_refusals():
    with pytest.raises(nx.ConfigError, match='w0="weights" anchors to the parameters'):
        nx.Nitro(OneBatch(), w0="weights", **quiet())
    with pytest.raises(nx.ConfigError, match="w0='latest'"):
        nx.Nitro(OneBatch(), w0="latest", **quiet())


class AnchoredAt(OneBatch):
    """OneBatch decaying toward `anchor`: "w0" or a tree."""

    anchor = "w0"

    def weight_decay(self, group=None):
        return 0.1

    def decay_anchor(self, group=None):
        return self.anchor


def test_w0_and_anchor_trees_must_match_the_parameters_leaf_for_leaf():
    scalars = {"w1": jnp.zeros(()), "b1": jnp.zeros(()), "w2": jnp.zeros((1,))}
    with pytest.raises(
        nx.ConfigError,
        match=r"w0 is a tree that does not match the parameters leaf for leaf: its "
        r"leaf \['b1'\] has shape \(\) where the parameter has shape \(16,\)\. "
        r"Pass a tree shaped like what build_model returns",
    ):
        nx.Nitro(AnchoredAt(), w0=scalars, **quiet())
    with pytest.raises(nx.ConfigError, match=r"w0 .* it has no leaf at \['w2'\]"):
        nx.Nitro(
            AnchoredAt(), w0={"w1": jnp.zeros((8, 16)), "b1": jnp.zeros(16)}, **quiet()
        )

    class TreeAnchored(AnchoredAt):
        anchor = scalars

    with pytest.raises(
        nx.ConfigError,
        match=r"decay_anchor\('default'\) returned a tree that does not match the "
        r"parameters leaf for leaf \(its leaf \['b1'\] has shape \(\)",
    ):
        nx.Nitro(TreeAnchored(), **quiet())
