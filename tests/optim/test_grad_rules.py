"""Gradient rules: SAM and ASAM against a direct implementation, rho as a program
input, custom perturb rules keyed by their code, and rules reading the scheduled
hyperparameters.
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
    loss_of,
    quiet,
)

import jaxnitro as nx


def sam_reference(rule, steps, params0, lr=0.05):
    """SAM / ASAM by hand: gradient at w + eps, RAdam on it."""
    tx = optax.radam(lr)
    params, state = params0, tx.init(params0)
    e = Tiny()
    for _ in range(steps):
        grad_fn = jax.grad(lambda p: loss_of(e, p, BATCH))
        g = grad_fn(params)
        if rule == "sam":
            norm = jnp.sqrt(sum(jnp.sum(x * x) for x in jax.tree.leaves(g)))
            eps = jax.tree.map(lambda x, n=norm: 0.05 * x / (n + 1e-12), g)
        else:
            t = {
                k: (jnp.abs(w) + 0.01 if w.ndim >= 2 else jnp.ones_like(w))
                for k, w in params.items()
            }
            tg = {k: t[k] * g[k] for k in g}
            norm = jnp.sqrt(sum(jnp.sum(x * x) for x in tg.values()))
            eps = {k: 0.5 * t[k] * t[k] * g[k] / (norm + 1e-12) for k in g}
        g2 = grad_fn(jax.tree.map(lambda p, d: p + d, params, eps))
        updates, state = tx.update(g2, state, params)
        params = optax.apply_updates(params, updates)
    return params


@pytest.mark.parametrize("rule", ["sam", "asam"])
def test_sam_and_asam_match_a_direct_implementation(rule):
    class Sharp(OneBatch):
        def grad_rule(self):
            return nx.SAM(0.05) if rule == "sam" else nx.ASAM(0.5, eta=0.01)

    nitro = nx.Nitro(Sharp(max_epochs=3), **quiet())
    nitro.train()
    assert_trees_close(
        nitro.parameters, sam_reference(rule, 3, initial_params()), rtol=1e-4
    )


def test_rho_is_an_input_and_schedulable():
    class Sharp(OneBatch):
        def grad_rule(self):
            return nx.SAM(0.05)

    nx.Nitro(Sharp(max_epochs=1), **quiet()).train()
    before = nx.cache_stats()["misses"]
    nx.Nitro(
        Sharp(max_epochs=1),
        schedules={"rho": lambda total: lambda t: 0.01 * t},
        **quiet(),
    ).train()
    assert nx.cache_stats()["misses"] == before


def test_a_custom_perturb_rule_is_keyed_by_its_code_and_fields():
    def shift_rule(scale):
        # Every rule this makes has the same qualname; only the closure differs.
        @dataclasses.dataclass(frozen=True)
        class Shift(nx.PerturbRule):
            def perturbation(self, grads, params, masks, values):
                return jax.tree.map(lambda g: scale * jnp.sign(g), grads)

        return Shift

    class Plain(nx.PerturbRule):  # not a dataclass: its attributes are its fields
        def __init__(self, scale):
            self.scale = scale

        def perturbation(self, grads, params, masks, values):
            return jax.tree.map(lambda g: self.scale * jnp.sign(g), grads)

    def trained(rule):
        class Sharp(OneBatch):
            def grad_rule(self):
                return rule

        # One program a rule: "auto" (an accelerator's default) adds a call of k.
        nitro = nx.Nitro(Sharp(max_epochs=2), steps_per_call=1, **quiet())
        nitro.train()
        return nitro.parameters

    plain = nx.Nitro(OneBatch(max_epochs=2), **quiet())
    plain.train()
    for zero, big in [(shift_rule(0.0)(), shift_rule(5.0)()), (Plain(0.0), Plain(5.0))]:
        assert_trees_close(trained(zero), plain.parameters)  # eps = 0: one pass's
        before = nx.cache_stats()["misses"]
        moved = trained(big)
        assert nx.cache_stats()["misses"] == before + 1
        assert not np.allclose(moved["w1"], plain.parameters["w1"])


def test_a_rule_field_that_cannot_key_a_program_is_refused():
    @dataclasses.dataclass(frozen=True)
    class Listed(nx.PerturbRule):
        scales: list

    class Sharp(OneBatch):
        def grad_rule(self):
            return Listed([0.1])

    with pytest.raises(nx.ConfigError, match="field `scales` = \\[0.1\\].*hashable"):
        nx.Nitro(Sharp(), **quiet())


def test_grad_rule_with_hp_reads_bind_values():
    seen = []

    class Warming(OneBatch):
        def grad_rule(self, hp):
            seen.append(hp["bind"]["sam_warm"])
            return nx.SAM(0.05 * hp["bind"]["sam_warm"])

    schedules = {"bind": {"sam_warm": lambda total: lambda t: min(1.0, t / 2)}}
    nitro = nx.Nitro(Warming(max_epochs=3), schedules=schedules, **quiet())
    nitro.train()
    assert seen[-3:] == [0.0, 0.5, 1.0]

    class Changes(OneBatch):
        def grad_rule(self, hp):
            return nx.SAM(0.05) if hp["bind"]["flip"] < 1 else nx.ASAM(0.5)

    flip = {"bind": {"flip": lambda total: lambda t: float(t)}}
    with pytest.raises(
        nx.ConfigError, match="the rule's type and its unscheduled fields"
    ):
        nx.Nitro(Changes(max_epochs=3), schedules=flip, **quiet()).train()


def test_grad_rule_with_hp_places_the_scheduled_values():
    class Doubled(OneBatch):
        def grad_rule(self, hp):
            return nx.SAM(2.0 * hp.get("rho", 0.05))

    class Direct(OneBatch):
        def grad_rule(self):
            return nx.SAM(0.1)

    placed = nx.Nitro(Doubled(max_epochs=2), schedules={"rho": 0.05}, **quiet())
    placed.train()
    direct = nx.Nitro(Direct(max_epochs=2), **quiet())
    direct.train()
    assert_trees_close(placed.parameters, direct.parameters, rtol=0, atol=0)


def test_grad_rule_with_hp_gets_step_zero_values_at_setup():
    class Placed(OneBatch):
        def grad_rule(self, hp):
            return nx.SAM(hp["rho"] * hp["bind"]["warm"])

    schedules = {
        "rho": lambda total: lambda t: 0.05 * (1 + t),
        "bind": {"warm": lambda total: lambda t: 0.5 + t},
    }
    nitro = nx.Nitro(Placed(max_epochs=1), schedules=schedules, **quiet())
    assert nitro.prepared.plan.grad_rule == nx.SAM(0.05 * 0.5)
    with pytest.raises(
        nx.ConfigError,
        match=r"read hp\['rho'\], but no schedule sets the rule field `rho`.*"
        r"hp.get\('rho', default\)",
    ):
        nx.Nitro(Placed(), **quiet())
    with pytest.raises(
        nx.ConfigError,
        match=r"read hp\['bind'\]\['warm'\], but no schedule binds `warm` "
        r"\(bound: none\)",
    ):
        nx.Nitro(Placed(), schedules={"rho": 0.05}, **quiet())

    class Switches(OneBatch):
        def grad_rule(self, hp):
            return nx.SAM(hp["rho"]) if hp["bind"]["on"] > 0.5 else nx.SingleGrad()

    with pytest.raises(
        nx.ConfigError, match="which has no schedulable field for schedule `rho`"
    ):
        nx.Nitro(Switches(), schedules={"rho": 0.05, "bind": {"on": 0.0}}, **quiet())
