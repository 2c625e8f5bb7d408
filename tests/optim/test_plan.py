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
                group = hp["groups"]["default"]
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
