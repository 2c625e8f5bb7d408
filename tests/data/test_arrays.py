"""ArraySource: arrays in memory cut into batches, shuffled per (seed, epoch)."""

import jax
import numpy as np
import pytest
from experiments import Tiny, make_batches

import jaxnitro as nx


def arrays(n: int, seed: int = 0) -> dict:
    batch = make_batches(n, n, seed=seed)[0]
    return {"x": batch["x"], "y": batch["y"]}


class FromArrays(Tiny):
    """Tiny fed by ArraySource: 70 train samples in batches of 16 (6 dropped)."""

    def build_data(self, dist):
        return {
            "train": nx.ArraySource(arrays(70), 16),
            "val": nx.ArraySource(arrays(24, 1), 16, shuffle=False, drop_last=False),
        }


def epoch_rows(source: nx.ArraySource) -> np.ndarray:
    return np.concatenate([batch["x"][:, 0] for batch in source])


def test_each_epoch_is_a_fresh_permutation_fixed_by_seed_and_epoch():
    data = {"x": np.arange(50.0), "z": np.arange(50) * 2}
    source = nx.ArraySource(data, 8, seed=3)
    assert (len(source), source.dropped_samples) == (6, 2)
    first, second = (
        np.concatenate([b["x"] for b in source]),
        np.concatenate([b["x"] for b in source]),
    )
    assert len(set(first.tolist())) == 48 and not np.array_equal(first, second)
    again = nx.ArraySource(data, 8, seed=3)
    again.set_epoch(1)  # a resume positioned at epoch 1 reads epoch 1's order
    np.testing.assert_array_equal(np.concatenate([b["x"] for b in again]), second)
    batch = source.batch_at(2, source.plan_for(0))
    np.testing.assert_array_equal(batch["z"], batch["x"] * 2)  # rows stay paired
    nx.data.check_batch_at(nx.ArraySource(data, 8, seed=3), values=True)
    other = nx.ArraySource(data, 8, seed=4)
    assert not np.array_equal(np.concatenate([b["x"] for b in other]), first)


def test_an_eval_source_keeps_the_short_last_batch_in_order():
    source = nx.ArraySource({"x": np.arange(10.0)}, 4, shuffle=False, drop_last=False)
    assert [b["x"].tolist() for b in source] == [
        [0.0, 1.0, 2.0, 3.0],
        [4.0, 5.0, 6.0, 7.0],
        [8.0, 9.0],
    ]
    assert source.dropped_samples == 0


def test_it_adopts_the_run_seed_fans_out_and_pads_the_eval_split():
    nitro = nx.Nitro(FromArrays(max_epochs=2), seed=7, logger=None, checkpointer=None)
    assert nitro.data["train"].seed == 7
    assert nitro.prepared.prefetch["train"].path in ("fanout", "fanout_unordered")
    nitro.train()
    assert nitro.current_epoch == 2
    # 24 val samples in a batch of 16 and a padded one of 8: every sample counted.
    direct = nitro.evaluate(split="val")
    lists = nx.Nitro(Tiny(), weights=nitro, logger=None, checkpointer=None)
    assert direct["loss"] == pytest.approx(lists.evaluate(split="val")["loss"])
    own = nx.ArraySource(arrays(70), 16, seed=1)
    nx.Nitro(FromArrays(), seed=7, data={"train": own}, logger=None, checkpointer=None)
    assert own.seed == 1  # a seed passed to the source is kept


def test_a_resumed_run_reads_the_same_batches_as_a_straight_one(tmp_path):
    straight = nx.Nitro(FromArrays(max_epochs=3), logger=None, checkpointer=None)
    straight.train()
    first = nx.Nitro(FromArrays(max_epochs=1), run_dir=str(tmp_path), logger=None)
    first.train()
    resumed = nx.Nitro(
        FromArrays(max_epochs=3), run_dir=str(tmp_path), logger=None, resume="auto"
    )
    resumed.train()
    for a, b in zip(
        jax.tree.leaves(straight.parameters),
        jax.tree.leaves(resumed.parameters),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_train_source_keeping_its_partial_batch_is_refused_naming_the_fix():
    class KeepsLast(FromArrays):
        def build_data(self, dist):
            return {"train": nx.ArraySource(arrays(70), 16, drop_last=False)}

    with pytest.raises(
        nx.ConfigError,
        match=r"partial last batch \(6 samples.*"
        r"ArraySource\(\.\.\., drop_last=True\)",
    ):
        nx.Nitro(KeepsLast(), logger=None, checkpointer=None)


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (({"x": np.zeros(4), "y": np.zeros(5)}, 2), {}, r"disagree.*x: 4, y: 5"),
        (({"x": np.zeros(4)}, 0), {}, r"`batch_size` must be an int >= 1, got 0"),
        (({"x": np.zeros(4)}, 8), {}, r"4 samples, fewer than batch_size=8"),
        (([np.zeros(4)], 2), {}, r"non-empty dict.*got list"),
        (({"x": np.float32(1)}, 2), {}, r"field `x` is a scalar"),
        (({"x": {"a": np.zeros(4)}}, 2), {}, r"field `x` is a dict; batch fields"),
        (({"x": np.zeros(4)}, 2), {"seed": 1.5}, r"`seed` must be an int or None"),
        (({"x": np.zeros(4)}, 2.0), {}, r"`batch_size` must be an int >= 1, got 2.0"),
    ],
)
def test_bad_arguments_are_refused_by_name(args, kwargs, message):
    with pytest.raises(nx.ConfigError, match=message):
        nx.ArraySource(*args, **kwargs)


def test_set_epoch_refuses_a_negative_epoch():
    source = nx.ArraySource({"x": np.zeros(4)}, 2)
    with pytest.raises(nx.ConfigError, match=r"`epoch` must be an int >= 0, got -1"):
        source.set_epoch(-1)
