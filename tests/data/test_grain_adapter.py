"""Grain datasets as splits: epoch plans from (seed, epoch), Grain's own batching."""

import grain
import numpy as np
import pytest

from jaxnitro.data.batch_at_check import check_batch_at
from jaxnitro.data.grain_adapter import GrainPlan, GrainSource
from jaxnitro.data.prefetch import (
    PrefetchIterator,
    batch_stream,
    check_prefetch,
    prefetch_config,
)
from jaxnitro.data.protocol import fanout_capable
from jaxnitro.data.sources import check_source_options, check_split, epoch_batches
from jaxnitro.errors import ConfigError


def _dataset(seed=7, n=24, bs=4):
    samples = [{"x": np.full(2, i, np.float32), "id": np.int32(i)} for i in range(n)]
    ds = grain.MapDataset.source(samples)
    return ds.shuffle(seed=seed).batch(bs, drop_remainder=True)


def _epoch(source, plan):
    return [source.batch_at(i, plan)["id"].tolist() for i in range(len(source))]


def test_an_epoch_is_a_function_of_seed_and_epoch():
    first, second = GrainSource(_dataset()), GrainSource(_dataset())
    plans = [first.begin_epoch() for _ in range(3)]
    assert plans == [GrainPlan(0), GrainPlan(1), GrainPlan(2)]
    assert first.epoch_token == 3
    epochs = [_epoch(first, p) for p in plans]
    assert [_epoch(second, p) for p in plans] == epochs  # same seed, same order
    # A fresh permutation each epoch: all three differ pairwise.
    assert epochs[0] != epochs[1] and epochs[1] != epochs[2]
    assert epochs[0] != epochs[2]
    assert _epoch(GrainSource(_dataset(seed=8)), GrainPlan(0)) != epochs[0]
    for ids in epochs:  # every sample once per epoch
        assert sorted(sum(ids, [])) == list(range(24))


def test_batching_and_shuffling_are_grains_own():
    ds = _dataset()
    source = GrainSource(ds)
    assert _epoch(source, source.begin_epoch()) == [b["id"].tolist() for b in ds]
    assert _epoch(source, GrainPlan(2)) == [
        ds[2 * 6 + i]["id"].tolist() for i in range(6)
    ]


def test_set_epoch_positions_a_resume():
    source = GrainSource(_dataset())
    source.set_epoch(4)
    assert source.begin_epoch() == GrainPlan(4)
    with pytest.raises(ConfigError, match=r"`epoch` must be an int >= 0, got -1"):
        source.set_epoch(-1)
    with pytest.raises(IndexError, match=r"batch index 6 is outside range\(6\)"):
        source.batch_at(6, GrainPlan(0))


def test_a_resumed_stream_reads_the_same_order_at_any_worker_count():
    def run(workers, epochs):
        split = PrefetchIterator(_dataset(), workers=workers)
        order = []
        for epoch in epochs:
            with batch_stream(split, ("x",), epoch=epoch) as stream:
                for host, device in stream:
                    order.append(host["id"].tolist())
                    stream.release(device)
        return order

    full = run(1, range(3))
    assert run(4, range(3)) == full
    assert run(2, [2]) == full[12:]  # resumed at epoch 2 (0-based)
    assert prefetch_config(PrefetchIterator(_dataset(), workers=2)).path == "fanout"


def test_a_map_dataset_has_the_trait_and_passes_check_batch_at():
    ds = _dataset()
    assert fanout_capable(ds)
    check_batch_at(ds, values=True)
    configs = check_prefetch({"train": PrefetchIterator(ds, workers=2)})
    assert configs["train"].workers == 2


def test_the_sources_helpers_look_through_the_wrapper():
    ds = _dataset()
    wrapped = PrefetchIterator(ds, workers=2)
    assert check_split("train", wrapped) == 6
    assert [b["id"].tolist() for b in epoch_batches(wrapped, 1)] == [
        ds[6 + i]["id"].tolist() for i in range(6)
    ]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: _dataset().to_iter_dataset(),
            "Split `train` is a grain.IterDataset (PrefetchIterDataset), which cannot "
            "be addressed by index",
        ),
        (
            lambda: _dataset().to_iter_dataset().mp_prefetch(),
            "Grain's prefetch threads or worker processes would be a second",
        ),
        (lambda: iter(_dataset()), "is a Grain iterator (PrefetchDatasetIterator)"),
        (
            lambda: grain.MapDataset.range(8).batch(2).filter(lambda b: b[0] > 0),
            "with `.filter()`, which leaves holes (None)",
        ),
        (lambda: _dataset().repeat(), "built on `.repeat()` with no epoch count"),
    ],
)
def test_check_source_options_refuses_what_the_pipeline_cannot_honour(make, message):
    source = make()
    with pytest.raises(ConfigError) as info:
        check_source_options(source, "train", None)
    assert message in str(info.value)


@pytest.mark.parametrize(
    "build",
    [
        lambda ds: ds.repeat().batch(4, drop_remainder=True),
        lambda ds: ds.shuffle(seed=1).repeat().batch(5),  # a partial last batch too
        lambda ds: ds.batch(4).repeat().map(lambda b: b),
        lambda ds: ds.repeat().batch(4).filter(lambda b: True),
    ],
    ids=["under-batch", "under-batch-partial", "under-map", "under-filter"],
)
def test_an_endless_repeat_anywhere_in_the_lineage_is_refused_first(build):
    samples = [{"x": np.full(2, i, np.float32)} for i in range(24)]
    ds = build(grain.MapDataset.source(samples))
    message = (
        r"Split `train` is a grain.MapDataset built on `.repeat\(\)` with no epoch "
        r"count \(RepeatMapDataset\(num_epochs=None\) in its lineage\), so len\(\) "
        rf"is {len(ds)} and an epoch never ends.*drop the `.repeat\(\)`"
    )
    with pytest.raises(ConfigError, match=message):
        check_split("train", ds)  # setup's first check, before any batch is read
    with pytest.raises(ConfigError, match=message):
        check_source_options(ds, "train", None)


def test_check_split_names_the_grain_fix():
    with pytest.raises(ConfigError, match="Pass the grain.MapDataset from before"):
        check_split("train", _dataset().to_iter_dataset())
    loader = grain.DataLoader(
        data_source=grain.sources.RangeDataSource(0, 8, 1),
        sampler=grain.samplers.IndexSampler(
            8, num_epochs=1, shard_options=grain.sharding.NoSharding()
        ),
        worker_count=0,
    )
    with pytest.raises(ConfigError, match="is a grain.DataLoader, which runs its own"):
        check_split("train", loader)


def test_a_list_of_batches_is_never_refused():
    check_source_options([{"x": np.zeros((2, 1))}], "train", None)
