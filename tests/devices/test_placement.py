"""Data parallelism on 4 devices (CPU ones in CI): the sharding rules, and a mesh run
that matches the single-device run (training, padded evaluation, predict,
checkpoints)."""

import os
import re

import jax
import numpy as np
import pytest
from handle_parts import parts_of
from jax.sharding import PartitionSpec as P
from mesh_experiments import MESHES, ManualRagged, Ragged, quiet, unpinned
from safetensors.numpy import load_file

import jaxnitro as nx
from jaxnitro.devices.placement import (
    Placement,
    check_batch_divides,
    padded_width,
)


@pytest.fixture(autouse=True)
def _unpinned(monkeypatch):
    unpinned(monkeypatch)


def spec(placement, role, leaf):
    sharding = placement.shardings(leaf, role)
    return sharding.spec


@pytest.mark.needs_devices(4)
@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        ((8, 2048), P(None, "data")),  # the largest dimension that divides
        ((2048, 3), P("data", None)),
        ((512, 1024), P(None, "data")),
        ((1024,), P("data")),
        ((16, 16), P()),  # under 1024 elements: replicated
        ((1030,), P()),  # no dimension divides by 4
        ((), P()),
    ],
)
def test_fsdp_splits_large_leaves_along_their_largest_divisible_dimension(
    shape, expected
):
    placement = Placement.build(n_devs=4, mode="fsdp")
    assert spec(placement, "state", np.zeros(shape, np.float32)) == expected
    replicated = Placement.build(n_devs=4, mode="replicated")
    assert spec(replicated, "state", np.zeros(shape, np.float32)) == P()


@pytest.mark.needs_devices(4)
def test_a_batch_splits_along_its_first_axis_and_a_prng_key_stays_whole():
    placement = Placement.build(n_devs=4, mode="fsdp")
    assert spec(placement, "batch", np.zeros((16, 8))) == P("data")
    assert spec(placement, "batch", np.zeros((10, 8))) == P()
    key = jax.random.split(jax.random.key(0), 2048)
    assert spec(placement, "state", key) == P()


def test_the_batch_must_divide_by_n_devs():
    message = (
        "The train batch holds 10 samples, which does not divide by n_devs=4 "
        "(10 % 4 = 2): the batch size is global and is split evenly across the "
        "devices. Use a batch size that is a multiple of 4 (e.g. 8 or 12), or an "
        "n_devs that divides 10."
    )
    with pytest.raises(nx.ConfigError, match=f"^{re.escape(message)}$"):
        check_batch_divides(10, 4)
    check_batch_divides(12, 4)
    assert [padded_width(w, 4) for w in (1, 4, 10, 12)] == [4, 4, 12, 12]


@pytest.mark.needs_devices(3)
def test_a_train_batch_n_devs_does_not_divide_is_refused_at_setup():
    with pytest.raises(
        nx.ConfigError,
        match="^The train batch holds 16 samples, which does not "
        "divide by n_devs=3 \\(16 % 3 = 1\\).*\\(e.g. 15 or 18\\)",
    ):
        nx.Nitro(Ragged(), n_devs=3, **quiet())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Ragged trained for two epochs on one device and on 4, checkpoints kept."""
    handles = {}
    for n_devs in (1, 4):
        run_dir = tmp_path_factory.mktemp(f"devs{n_devs}")
        nitro = nx.Nitro(Ragged(), n_devs=n_devs, run_dir=str(run_dir), logger=None)
        nitro.train()
        handles[n_devs] = nitro
    return handles


@pytest.mark.needs_devices(4)
def test_training_on_4_devices_matches_one_device(runs):
    one, four = runs[1], runs[4]
    for name, value in one.parameters.items():
        sharded = four.parameters[name]
        assert sharded.sharding.spec == P() and len(sharded.sharding.device_set) == 4
        np.testing.assert_allclose(np.asarray(sharded), value, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        four.history.column("train_loss"), one.history.column("train_loss"), rtol=1e-5
    )


@pytest.mark.needs_devices(4)
def test_the_train_step_splits_the_batch_and_reduces_the_gradient(runs):
    (kind, step), *_ = runs[4].executables.compiled()
    assert kind == "train_step"
    # The calls loop's program: its block of batches (K, B, ...) split along B.
    block_shardings = step.compiled.input_shardings[0][5]
    assert {s.spec for s in jax.tree.leaves(block_shardings)} == {P(None, "data")}
    assert "all-reduce" in step.compiled.as_text()


@pytest.mark.needs_devices(4)
def test_padded_evaluation_and_predict_stay_exact_on_4_devices(runs):
    one, four = runs[1], runs[4]
    assert (
        parts_of(one).evaluation.eval_width,
        parts_of(four).evaluation.eval_width,
    ) == (10, 12)
    for split in ("val", "test"):
        a, b = one.evaluate(split), four.evaluate(split)
        assert a["acc"] == b["acc"]  # counted over 25 and 13 real samples
        np.testing.assert_array_equal(a["confusion"], b["confusion"])
        assert b["confusion"].sum() == {"val": 25, "test": 13}[split]
    batch = {"x": np.random.default_rng(3).normal(size=(7, 8)).astype(np.float32)}
    np.testing.assert_allclose(
        four.predict(batch), one.predict(batch), rtol=1e-5, atol=1e-6
    )
    assert four.predict(batch).shape == (7, 3)


@pytest.mark.needs_devices(4)
def test_a_mesh_run_writes_the_same_checkpoint_content(runs):
    def newest(nitro):
        entry = max(nitro.checkpointer.entries(), key=lambda e: e.step)
        return load_file(os.path.join(nitro.checkpointer.dir, entry.file))

    one, four = newest(runs[1]), newest(runs[4])
    assert sorted(one) == sorted(four)
    for name, array in one.items():
        assert (four[name].shape, four[name].dtype) == (array.shape, array.dtype)
        np.testing.assert_allclose(four[name], array, rtol=1e-5, atol=1e-6)


@pytest.mark.needs_devices(4)
@pytest.mark.parametrize(
    ("experiment", "keywords"),
    [(Ragged(max_epochs=1), {"accum": 2}), (ManualRagged(max_epochs=1), {})],
    ids=["accumulated", "manual"],
)
def test_accumulated_and_manual_steps_on_4_devices_match_one_device(
    experiment, keywords
):
    MESHES.clear()
    one = nx.Nitro(experiment, **quiet(**keywords)).train()
    four = nx.Nitro(experiment, n_devs=4, **quiet(**keywords)).train()
    for name, value in one.parameters.items():
        np.testing.assert_allclose(
            np.asarray(four.parameters[name]), value, rtol=1e-5, atol=1e-6
        )
    if isinstance(experiment, ManualRagged):
        assert MESHES[0] is None
        assert MESHES[1].shape == {"data": 4}


@pytest.mark.needs_devices(4)
def test_predict_on_a_handle_without_data_pads_to_a_multiple_of_n_devs():
    nitro = nx.Nitro(Ragged(), n_devs=4, data={}, **quiet())
    one = nx.Nitro(Ragged(), data={}, **quiet())
    x = {"x": np.random.default_rng(4).normal(size=(7, 8)).astype(np.float32)}
    out = nitro.predict(x)
    assert (out.shape, parts_of(nitro).evaluation.eval_width) == ((7, 3), 8)
    np.testing.assert_allclose(out, one.predict(x), rtol=1e-5, atol=1e-6)
