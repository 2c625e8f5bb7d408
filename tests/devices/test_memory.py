"""memory_report, and fsdp: the training state split along the data axis (about
1/n_devs of it per device), training to the numbers of the replicated layout, and
its checkpoints restoring onto any device count."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from mesh_experiments import Wide, unpinned
from safetensors.numpy import load_file

import jaxnitro as nx
from jaxnitro.devices.memory import memory_report
from jaxnitro.devices.placement import Placement

pytestmark = pytest.mark.needs_devices(4)  # a mesh of 4 in every test


@pytest.fixture(autouse=True)
def _unpinned(monkeypatch):
    unpinned(monkeypatch)


def test_memory_report_sums_the_shards_each_device_holds():
    mesh = Placement.build(n_devs=4, mode="fsdp").mesh
    split = jax.device_put(jnp.zeros((8, 16)), NamedSharding(mesh, P("data")))
    whole = jax.device_put(jnp.zeros(4), NamedSharding(mesh, P()))
    report = memory_report({"params": split, "opt_state": whole, "ema": None})
    assert report == {
        str(device): {"params": 128, "opt_state": 16, "ema": 0, "total": 144}
        for device in mesh.devices.flat  # "cpu:0" ... "cpu:3" on a CPU
    }


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Wide trained one epoch with an EMA on 4 devices, replicated and fsdp."""
    handles = {}
    for sharding in ("replicated", "fsdp"):
        run_dir = tmp_path_factory.mktemp(sharding)
        nitro = nx.Nitro(
            Wide(),
            n_devs=4,
            sharding=sharding,
            ema=nx.EMA(0.9),
            run_dir=str(run_dir),
            logger=None,
        )
        nitro.train()
        handles[sharding] = nitro
    return handles


def test_fsdp_holds_a_quarter_of_the_state_per_device(trained):
    replicated = trained["replicated"].memory_report()
    fsdp = trained["fsdp"].memory_report()
    names = [str(device) for device in jax.local_devices()[:4]]  # "cpu:0" ...
    assert sorted(fsdp) == sorted(names)
    whole = replicated[names[0]]
    params = (8 * 2048 + 2048 + 2048 * 3) * 4
    assert whole["params"] == whole["ema"] == params
    for row in fsdp.values():
        assert row["params"] == row["ema"] == params // 4
        # Adam's moments split too; only its step count stays whole.
        assert row["opt_state"] <= whole["opt_state"] / 4 + 16
    specs = {k: v.sharding.spec for k, v in trained["fsdp"].parameters.items()}
    assert specs == {"w1": P(None, "data"), "b1": P("data"), "w2": P("data", None)}


def test_fsdp_trains_to_the_numbers_of_the_replicated_layout(trained):
    for name, value in trained["replicated"].parameters.items():
        np.testing.assert_allclose(
            np.asarray(trained["fsdp"].parameters[name]),
            np.asarray(value),
            rtol=1e-5,
            atol=1e-6,
        )
    assert trained["fsdp"].validate()["acc"] == trained["replicated"].validate()["acc"]


def resume(saved, n_devs):
    """The fsdp run's checkpoint resumed on `n_devs` devices, for a second epoch."""
    return nx.Nitro(
        Wide(max_epochs=2),
        n_devs=n_devs,
        sharding="fsdp",
        ema=nx.EMA(0.9),
        run_dir=saved.run_dir,
        resume="auto",
        logger=None,
        checkpointer=None,
    )


@pytest.fixture(scope="module")
def continued(trained):
    """The fsdp run's second epoch, resumed on the 4 devices it was saved from."""
    return jax.device_get(resume(trained["fsdp"], 4).train().train_state.weights)


@pytest.mark.parametrize("n_devs", [1, 2])
def test_an_fsdp_checkpoint_resumes_on_another_device_count(trained, continued, n_devs):
    saved = trained["fsdp"]
    entry = max(saved.checkpointer.entries(), key=lambda e: e.step)
    record = load_file(os.path.join(saved.checkpointer.dir, entry.file))
    resumed = resume(saved, n_devs)
    assert resumed.current_epoch == 1
    for name, value in resumed.parameters.items():
        assert len(value.sharding.device_set) == n_devs
        np.testing.assert_array_equal(np.asarray(value), record[f"params/['{name}']"])
    for name, value in resumed.train_state.ema.items():
        np.testing.assert_array_equal(np.asarray(value), record[f"ema/['{name}']"])
    # The optimizer state restores too: the second epoch matches the one resumed
    # on the 4 devices the checkpoint was saved from.
    weights = jax.device_get(resumed.train().train_state.weights)
    pairs = zip(jax.tree.leaves(weights), jax.tree.leaves(continued), strict=True)
    for got, want in pairs:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
