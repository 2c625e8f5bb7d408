"""Optimizer rules and groups: the three levels, learning-rate ratios, decay fields
and what a rule may not do.

Every formula is checked against a direct Optax or NumPy computation of the same
steps on the same data.
"""

import re

import jax
import jax.numpy as jnp
import optax
import pytest
from experiments import Tiny
from optim_reference import (
    BATCH,
    Grouped,
    Level2,
    OneBatch,
    assert_trees_close,
    initial_params,
    loss_of,
    quiet,
    reference,
)

import jaxnitro as nx


def test_groups_ratios_and_decay_match_optax():
    nitro = nx.Nitro(Grouped(max_epochs=3), **quiet())
    assert nitro.prepared.plan.layout.names == ("default", "encoder")
    nitro.train()
    labels = {"w1": "encoder", "b1": "encoder", "w2": "default"}
    mask = {"w1": True, "b1": False, "w2": True}  # default_no_decay: no 1-D leaves
    tx = optax.multi_transform(
        {
            "default": optax.radam(0.1),
            "encoder": optax.chain(
                optax.radam(0.01), decay_toward_zero(0.5 * 0.01, mask)
            ),
        },
        labels,
    )
    expected = reference(tx, 3, BATCH, initial_params())
    assert_trees_close(nitro.parameters, expected)


def decay_toward_zero(coefficient, mask):
    """update <- update - coefficient * w on the masked leaves (by hand)."""

    def init(params):
        return optax.EmptyState()

    def update(updates, state, params):
        new = {
            k: u - coefficient * params[k]
            if mask[k] and not isinstance(u, optax.MaskedNode)
            else u
            for k, u in updates.items()
        }
        return new, state

    return optax.GradientTransformation(init, update)


def test_learning_rate_zero_is_refused():
    class Zero(OneBatch):
        def learning_rate(self, group=None):
            return 0.0

    with pytest.raises(nx.ConfigError, match="learning_rate\\(\\) returned 0.0"):
        nx.Nitro(Zero(), **quiet())


class StringRate(Tiny):
    learning_rate: float = "1e-3"


class StringDecayMethod(Tiny):
    def weight_decay(self, group=None):
        return "0.01"


@pytest.mark.parametrize(
    ("cls", "message"),
    [
        (
            StringRate,
            "StringRate.learning_rate gave '1e-3' (a str) for the 'default' group; "
            "it must be a number, and a string is refused even when it reads as one. "
            "Write the number itself, e.g. learning_rate=0.001.",
        ),
        (
            StringDecayMethod,
            "StringDecayMethod.weight_decay gave '0.01' (a str) for the 'default' "
            "group; it must be a number, and a string is refused even when it reads "
            "as one. Write the number itself, e.g. weight_decay=0.0001.",
        ),
    ],
)
def test_a_hyperparameter_given_as_a_string_is_refused(cls, message):
    with pytest.raises(nx.ConfigError, match=f"^{re.escape(message)}$"):
        nx.Nitro(cls(), logger=None, checkpointer=None)


def test_level1_rule_called_by_name_with_a_scheduled_field():
    class Momentum(OneBatch):
        def optimizer(self):
            return optax.sgd

        def learning_rate(self, group=None):
            return 0.1

    schedules = {
        "momentum": 0.9,
        "learning_rate": lambda total: lambda t: 0.1 / (1 + t),
    }
    nitro = nx.Nitro(Momentum(max_epochs=3), schedules=schedules, **quiet())
    nitro.train()
    lr = optax.inject_hyperparams(optax.sgd)(learning_rate=0.1, momentum=0.9)
    params, state = initial_params(), lr.init(initial_params())
    for t in range(3):
        state.hyperparams["learning_rate"] = jnp.asarray(0.1 / (1 + t))
        grads = jax.grad(lambda p: loss_of(Tiny(), p, BATCH))(params)
        updates, state = lr.update(grads, state, params)
        params = optax.apply_updates(params, updates)
    assert_trees_close(nitro.parameters, params)


def test_a_rule_that_decays_by_itself_is_refused():
    class DoubleDecay(OneBatch):
        def optimizer(self):
            return optax.adamw

    with pytest.raises(
        nx.ConfigError, match="optax.adamw, which decays the weights by itself"
    ) as info:
        nx.Nitro(DoubleDecay(), **quiet())
    assert "optax.adam for optax.adamw" in str(info.value)


def test_level2_builds_the_chain_from_hp():
    nitro = nx.Nitro(Level2(max_epochs=2), schedules={"momentum": 0.5}, **quiet())
    nitro.train()
    mask = {"w1": True, "b1": False, "w2": True}
    tx = optax.chain(optax.sgd(0.05, momentum=0.5), decay_toward_zero(0.1 * 0.05, mask))
    expected = reference(tx, 2, BATCH, initial_params())
    assert_trees_close(nitro.parameters, expected)


def test_level2_decay_not_last_is_refused():
    class Misplaced(Level2):
        def optimizer(self, group, hp):
            return optax.chain(
                nx.Decay(hp["weight_decay"], hp["anchor"], hp["no_decay_mask"]),
                optax.adam(hp["learning_rate"]),
            )

    with pytest.raises(nx.HookError, match="does not end with jaxnitro.Decay"):
        nx.Nitro(Misplaced(), **quiet())


def test_level2_scheduled_field_that_is_never_read_is_refused():
    class Ignores(Level2):
        def optimizer(self, group, hp):
            return optax.chain(
                optax.sgd(hp["learning_rate"], momentum=0.9),
                nx.Decay(hp["weight_decay"], hp["anchor"], hp["no_decay_mask"]),
            )

    with pytest.raises(nx.ConfigError, match="never reads it"):
        nx.Nitro(Ignores(), schedules={"momentum": 0.5}, **quiet())


def test_level2_scheduled_learning_rate_that_is_never_read_is_refused():
    class FixedRate(Level2):
        def optimizer(self, group, hp):
            return optax.chain(
                optax.sgd(0.05, momentum=hp["momentum"]),
                nx.Decay(hp["weight_decay"], hp["anchor"], hp["no_decay_mask"]),
            )

    schedules = {"momentum": 0.5, "learning_rate": lambda step: 0.05 / (1 + step)}
    with pytest.raises(
        nx.ConfigError,
        match=r"The schedule on `learning_rate` reaches group 'default''s level-2 "
        r"chain as hp\['learning_rate'\], but optimizer\(self, 'default', hp\) "
        r"never reads it: .*Read hp\['learning_rate'\] in the rule it belongs to, "
        r"or remove the schedule\.",
    ):
        nx.Nitro(FixedRate(), schedules=schedules, **quiet())
    # Read, the same schedule is accepted.
    nx.Nitro(Level2(), schedules=schedules, **quiet())


def test_level2_scheduled_weight_decay_that_is_never_read_is_refused():
    class FrozenDecay(OneBatch):
        """Reads hp["weight_decay"] once, at setup, and keeps that value."""

        frozen = None

        def optimizer(self, group, hp):
            if FrozenDecay.frozen is None:
                FrozenDecay.frozen = hp["weight_decay"]
            return optax.chain(
                optax.sgd(hp["learning_rate"], momentum=hp["momentum"]),
                nx.Decay(FrozenDecay.frozen, hp["anchor"], hp["no_decay_mask"]),
            )

    schedules = {"momentum": 0.5, "weight_decay": lambda step: 0.1 / (1 + step)}
    with pytest.raises(
        nx.ConfigError, match=r"schedule on `weight_decay` .* never reads it"
    ):
        nx.Nitro(FrozenDecay(), schedules=schedules, **quiet())


def test_level2_scheduled_rate_and_decay_read_pass_the_probe():
    # Read, neither is refused: not at a warmup's zero rate, not where the weights
    # start at their "w0" anchor, not in a group whose leaves none decay.
    class Anchored(OneBatch):
        optimizer = Level2.optimizer

        def decay_anchor(self, group=None):
            return "w0"

        def param_group(self, keypath):
            return "biases" if keypath[0].startswith("b") else "default"

    schedules = {
        "momentum": 0.5,
        "learning_rate": lambda step: 0.01 * step,
        "weight_decay": lambda step: 0.1 / (1 + step),
    }
    nitro = nx.Nitro(Anchored(max_epochs=1), schedules=schedules, **quiet())
    nitro.train()


def test_a_declared_nonschedulable_field_is_refused():
    def clipped_sgd(learning_rate, max_norm=1.0):
        parts = [optax.clip_by_global_norm(max_norm)] if max_norm > 0 else []
        return optax.chain(*parts, optax.sgd(learning_rate))

    class Clipped(OneBatch):
        def optimizer(self):
            return clipped_sgd

    assert nx.nonschedulable(clipped_sgd) == ()
    assert nx.optim.declare_nonschedulable(clipped_sgd, "max_norm") is clipped_sgd
    assert nx.nonschedulable(clipped_sgd) == ("max_norm",)
    with pytest.raises(
        nx.ConfigError,
        match=r"Schedule `max_norm` = 0.5: `max_norm` of group 'default''s rule is "
        r"not schedulable: .*clipped_sgd declares it non-schedulable .*"
        r"functools.partial\(.*clipped_sgd, max_norm=...\)",
    ):
        nx.Nitro(Clipped(), schedules={"max_norm": 0.5}, **quiet())
    nx.optim.declare_nonschedulable(clipped_sgd)  # a declaration replaces the last one
    assert nx.nonschedulable(clipped_sgd) == ()
    with pytest.raises(
        nx.ConfigError, match=r"clipped_sgd has no parameter `max_nrom`.*max_norm\."
    ):
        nx.optim.declare_nonschedulable(clipped_sgd, "max_nrom")
    with pytest.raises(nx.ConfigError, match="name each field by a string"):
        nx.optim.declare_nonschedulable(clipped_sgd, 3)
    with pytest.raises(nx.ConfigError, match="the first argument is the rule"):
        nx.optim.declare_nonschedulable(optax.sgd(0.1), "momentum")


def test_level2_that_returns_no_chain_is_refused_at_setup():
    class Named(OneBatch):  # no decay, no schedule: nothing else probes the hook
        def optimizer(self, group, hp):
            return "sgd"

    with pytest.raises(
        nx.HookError,
        match=r"optimizer\(self, 'default', hp\) returned str \('sgd'\); it must "
        r"return an Optax GradientTransformation",
    ):
        nx.Nitro(Named(), **quiet())


def test_weight_decay_may_be_a_field():
    class FieldDecay(OneBatch):
        weight_decay: float = 0.0

    class MethodDecay(OneBatch):
        def weight_decay(self, group=None):
            return 0.1

    by_field = nx.Nitro(FieldDecay(max_epochs=2, weight_decay=0.1), **quiet())
    assert [(g.weight_decay, g.decays) for g in by_field.prepared.plan.groups] == [
        (0.1, True)
    ]
    by_field.train()
    by_method = nx.Nitro(MethodDecay(max_epochs=2), **quiet())
    by_method.train()
    assert_trees_close(by_field.parameters, by_method.parameters, rtol=0, atol=0)


def test_a_field_named_like_a_hook_is_refused():
    class Field(OneBatch):
        grad_rule: object = None

    with pytest.raises(
        nx.ConfigError, match="has a field `grad_rule`, but `grad_rule` is a hook"
    ):
        nx.Nitro(Field(), **quiet())
