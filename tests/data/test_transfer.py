"""Placing a host batch on a device."""

import jax
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
