"""Placing a host batch on a device."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnitro.data.transfer import transfer


def test_transfer_places_host_arrays_and_keeps_device_ones(clean):
    on_device = jax.device_put(np.ones(3, np.float32))
    placed = transfer({"a": np.arange(3.0), "b": on_device})
    assert placed["b"] is on_device and isinstance(placed["a"], jax.Array)
    np.testing.assert_array_equal(np.asarray(placed["a"]), np.arange(3.0))
    for array in (*placed.values(),):
        array.delete()


@pytest.mark.needs_devices(3)  # two devices other than the default one
def test_transfer_places_on_the_sharding_or_device_it_is_given(clean):
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[1])
    assert transfer({"a": np.zeros(2)}, sharding)["a"].devices() == {jax.devices()[1]}
    assert transfer({"a": np.zeros(2)}, jax.devices()[2])["a"].devices() == {
        jax.devices()[2]
    }


def test_a_copy_is_not_waited_for_behind_the_work_queued_on_the_device(clean):
    """The copy is a program the device runs after what is queued: transfer returns
    while a long program still runs (a wait would last until it ended), and a
    program reading the arrays sees them."""

    @jax.jit
    def long(x):
        return jax.lax.fori_loop(0, 40, lambda i, x: jnp.tanh(x @ x) * 0.5, x)

    x = jnp.ones((768, 768), jnp.float32)
    long(x).block_until_ready()  # compiled
    transfer({"a": np.zeros(3, np.float32)})  # the identity compiled
    running = long(x)
    placed = transfer({"a": np.arange(3.0, dtype=np.float32)})
    assert not running.is_ready()
    np.testing.assert_array_equal(np.asarray(placed["a"] * 2), [0.0, 2.0, 4.0])
    running.block_until_ready()
