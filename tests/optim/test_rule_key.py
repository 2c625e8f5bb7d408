"""rule_key: Optax transformations compare by what they compute."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxnitro.keys.program_key import Identity
from jaxnitro.optim.rule_key import rule_key


def contains_identity(key) -> bool:
    if isinstance(key, Identity):
        return True
    return isinstance(key, tuple) and any(contains_identity(k) for k in key)


@pytest.mark.parametrize(
    "build",
    [
        lambda lr: optax.adam(lr),
        lambda lr: optax.adamw(lr, weight_decay=1e-4),
        lambda lr: optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(lr, 0.9)),
        lambda lr: optax.sgd(optax.warmup_cosine_decay_schedule(0.0, lr, 10, 100)),
        lambda lr: optax.multi_transform(
            {"a": optax.adam(lr), "b": optax.sgd(0.1)}, {"w": "a", "v": "b"}
        ),
    ],
)
def test_a_rule_built_twice_is_one_key_and_another_value_another(build):
    assert rule_key(build(1e-3)) == rule_key(build(1e-3))
    assert hash(rule_key(build(1e-3))) == hash(rule_key(build(1e-3)))
    assert not contains_identity(rule_key(build(1e-3)))  # described by value
    assert rule_key(build(1e-3)) != rule_key(build(2e-3))


def test_different_rules_and_values_never_share_a_key():
    keys = [
        rule_key(optax.adam(1e-3)),
        rule_key(optax.adamw(1e-3)),
        rule_key(optax.sgd(1e-3)),
        rule_key(optax.sgd(1e-3, momentum=0.9)),
        rule_key(optax.adam(1e-3, b1=0.8)),
        rule_key(optax.adam(np.float32(1e-3))),  # another type: another key
    ]
    assert len(set(keys)) == len(keys)


def test_an_indescribable_object_keys_by_identity():
    class Opaque:
        pass

    marker = Opaque()
    key = rule_key((marker,))
    assert contains_identity(key) and key == rule_key((marker,))
    assert key != rule_key((Opaque(),))


def test_a_jitted_step_is_reused_for_a_rule_built_again():
    import jaxnitro as nx

    params = {"w": jnp.ones(3)}
    traces = []

    @jax.jit
    def step(state, params):
        traces.append(1)
        grads = jax.tree.map(jnp.ones_like, params)
        return nx.step_optimizer(state, params, grads)

    step(nx.setup_optimizer(optax.adam(1e-3), params), params)
    step(nx.setup_optimizer(optax.adam(1e-3), params), params)
    assert len(traces) == 1
    step(nx.setup_optimizer(optax.adam(5e-3), params), params)
    assert len(traces) == 2
