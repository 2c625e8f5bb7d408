"""The optimizer plan's step: gradient clipping against Optax, and no clipping ops at
all when it is off.
"""

import jax
import numpy as np

from jaxnitro.compile.boundary import Weights
from jaxnitro.optim.plan import single_group_plan


def test_clipping_matches_optax():
    import optax

    params = {"w": np.full((3,), 2.0, np.float32)}
    grads = {"w": np.full((3,), 4.0, np.float32)}  # global norm 6.93
    plan = single_group_plan(params, learning_rate=0.1, clip_norm=1.0)

    def step(p, state, g, hp):
        return plan.apply(None, Weights(p, state, None), g, hp)[0]

    new = jax.jit(step)(params, plan.init_state(params), grads, plan.step_inputs(0))
    clipped, _ = optax.clip_by_global_norm(1.0).update(grads, optax.EmptyState())
    updates, _ = optax.radam(0.1).update(clipped, optax.radam(0.1).init(params), params)
    np.testing.assert_allclose(new["w"], params["w"] + updates["w"], rtol=1e-6)


def test_clip_zero_emits_no_clipping_ops():
    import optax

    params = {"w": np.ones((4, 4), np.float32)}

    def lowered(plan, by_hand=False):
        def step(p, state, grads, hp):
            if by_hand:  # the rule alone on the step's inputs, written by hand
                group = hp.groups["default"]
                fields = {name: group[name] for name in plan.groups[0].scheduled}
                rule = optax.radam(group["learning_rate"], **fields)
                updates, state = rule.update(grads, state, p)
                new = jax.tree.map(lambda a, u: (a + u).astype(a.dtype), p, updates)
                return new, state
            return plan.apply(None, Weights(p, state, None), grads, hp)[:2]

        args = (params, plan.init_state(params), params, plan.step_inputs(0))
        text = jax.jit(step).lower(*args).as_text()
        return [line for line in text.splitlines() if "stablehlo." in line]

    off = single_group_plan(params, learning_rate=1e-3, clip_norm=0.0)
    on = single_group_plan(params, learning_rate=1e-3, clip_norm=1.0)
    assert lowered(off) == lowered(off, by_hand=True)
    clipped = lowered(on)
    by_hand = lowered(on, by_hand=True)
    assert len(clipped) > len(by_hand)
    sqrt = sum("stablehlo.sqrt" in line for line in clipped)
    assert sqrt == sum("stablehlo.sqrt" in line for line in by_hand) + 1


def test_step_inputs_flatten_as_the_dict_they_replaced():
    """The typed step inputs keep the leaf order of a dict of the same entries (keys
    sorted), so the packed float columns and the programs stay what they were."""
    from jaxnitro.compile.optimizer_step import StepInputs

    f = np.float32
    every = StepInputs(
        ema={"decay": f(0.9), "update": np.bool_(True)},
        grad={"values": {"rho": f(0.05)}, "masks": {"w": np.ones(2, bool)}},
        gradient_clip_norm=f(1.0),
        groups={"b": {"learning_rate": f(0.1)}, "a": {"learning_rate": f(0.2)}},
        manual=((f(0.3), np.bool_(False)),),
    )
    plan = single_group_plan({"w": np.ones(3, np.float32)}, learning_rate=0.1)
    for inputs in (every, plan.step_inputs(0)):
        as_dict = {k: v for k, v in inputs._asdict().items() if v is not None}
        new, old = jax.tree.leaves(inputs), jax.tree.leaves(as_dict)
        assert all(a is b for a, b in zip(new, old, strict=True))
