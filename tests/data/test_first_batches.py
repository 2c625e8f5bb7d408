"""first_batches: a split cut to its first n batches, its kind kept."""

import numpy as np
from toy_sources import Indexed

import jaxnitro as nx
from jaxnitro.data.first_batches import FirstBatches, first_batches
from jaxnitro.data.protocol import fanout_capable


def test_a_list_is_sliced_and_a_wrapper_keeps_its_settings():
    batches = [{"x": np.full(2, i)} for i in range(5)]
    assert first_batches(batches, 2) == batches[:2]
    wrapped = nx.data.PrefetchIterator(batches, workers=1, device_batches=2)
    cut = first_batches(wrapped, 3)
    assert isinstance(cut, nx.data.PrefetchIterator) and cut.device_batches == 2
    assert len(cut) == 3 and len(wrapped) == 5  # the original is not changed


def test_an_indexed_source_still_fans_out_over_its_first_batches():
    source = Indexed(6)
    cut = first_batches(source, 2)
    assert isinstance(cut, FirstBatches) and fanout_capable(cut)
    plan = cut.begin_epoch()
    assert len(cut) == 2
    assert [cut.batch_at(i, plan)["x"].tolist() for i in range(2)] == [
        source.batch_at(i, plan)["x"].tolist() for i in range(2)
    ]
    assert len(list(cut)) == 2
    assert len(first_batches(Indexed(1), 2)) == 1  # never more than the source has


def test_a_grain_map_dataset_stays_one():
    grain = __import__("grain")
    ds = grain.MapDataset.source([{"x": np.full(2, i)} for i in range(5)])
    cut = first_batches(ds, 2)
    assert isinstance(cut, grain.MapDataset) and len(cut) == 2
