"""What a training program's boundary needs before the first step: buffers it may
donate, made without compiling anything."""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from experiments import HostBuilt, make_batches

import jaxnitro as nx
from jaxnitro.compile.boundary import owned_copy

BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"


@contextlib.contextmanager
def xla_compiles():
    """The XLA compilations run inside the block (eager ops included), counted."""
    seen: list[float] = []

    def listen(event, seconds, **_):
        if event == BACKEND_COMPILE:
            seen.append(seconds)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        yield seen
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)


def test_owned_copy_compiles_nothing_and_owns_every_buffer():
    # Shapes no other test uses: `jnp.array` would compile a copy program for each.
    tree = {"w": jnp.ones((7, 13)), "b": jnp.zeros((13,)), "n": jnp.array(3)}
    with xla_compiles() as compiles:
        copied = owned_copy(tree)
        jax.block_until_ready(copied)
    assert compiles == []
    for name, leaf in tree.items():
        assert copied[name].unsafe_buffer_pointer() != leaf.unsafe_buffer_pointer()
        np.testing.assert_array_equal(copied[name], leaf)
    # Donating the copy leaves the original whole.
    jax.jit(lambda t: jax.tree.map(lambda a: a + 1, t), donate_argnums=0)(copied)
    assert all(not leaf.is_deleted() for leaf in tree.values())
    np.testing.assert_array_equal(tree["w"], np.ones((7, 13), np.float32))


@pytest.mark.parametrize(
    "leaf",
    [
        1.0,
        2,
        True,
        np.float64(1.5),
        np.ones(3, np.int64),
        np.ones(2, ml_dtypes.bfloat16),
        jnp.ones(2, jnp.bfloat16),
        jnp.array(1.0),
    ],
    ids=repr,
)
def test_owned_copy_gives_the_dtype_and_weak_type_jnp_array_gives(leaf):
    copied, reference = owned_copy(leaf), jnp.array(leaf)
    assert (copied.dtype, copied.weak_type, copied.shape) == (
        reference.dtype,
        reference.weak_type,
        reference.shape,
    )


def test_setup_compiles_no_xla_program_of_its_own():
    # Everything before the first step that is not the user's own eager code (the
    # parameter copies, the Device fields, the optimizer plan's masks) runs
    # without an XLA compile: each costs 5-30 ms on a CPU.
    # The run's key is the one eager op setup runs for the user (build_model's
    # rng); JAX's in-process caches are emptied, so nothing compiled by an earlier
    # test hides a compile here.
    data = {"train": make_batches(32, 16), "val": make_batches(16, 16, seed=1)}
    jax.clear_caches()
    jax.random.key(0)
    with xla_compiles() as compiles:
        nitro = nx.Nitro(HostBuilt(), data=data, logger=None, checkpointer=None)
    assert compiles == []
    assert nitro.train_state.params["w1"].shape == (8, 16)
