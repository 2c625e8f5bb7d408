"""The training loop's feed checks every batch's routed fields as the stream does."""

import jax
import numpy as np
import pytest
from experiments import Tiny, make_batches

import jaxnitro as nx


def test_a_train_list_batch_missing_a_routed_field_names_it():
    class Holey(Tiny):
        def build_data(self, dist):
            batches = make_batches(self.n_train, 16)
            del batches[1]["y"]  # `loss` declares y; the first batch has it
            return {"train": batches}

    nitro = nx.Nitro(Holey(max_epochs=1), logger=None, checkpointer=None)
    with pytest.raises(nx.RoutingError, match="split `train` has no field `y`"):
        nitro.train()


class Shuffled:
    """Tiny's train data as a random-access source, reshuffled each epoch."""

    def __init__(self):
        batches = make_batches(64, 16)
        self.x = np.concatenate([b["x"] for b in batches])
        self.y = np.concatenate([b["y"] for b in batches])
        self.epoch_token = 0
        self.seeks: list[int] = []
        self._epoch = 0

    def __len__(self):
        return 4

    def set_epoch(self, epoch):
        self.seeks.append(epoch)
        self._epoch = epoch

    def begin_epoch(self):
        plan = np.random.default_rng([5, self._epoch]).permutation(len(self.x))
        self._epoch += 1
        self.epoch_token += 1
        return plan

    def batch_at(self, i, plan):
        rows = plan[i * 16 : (i + 1) * 16]
        return {"x": self.x[rows], "y": self.y[rows]}


@pytest.mark.parametrize("staged", [False, True], ids=["cpu", "staged"])
def test_the_inline_feed_positions_a_source_at_each_epoch_as_the_stream_does(
    monkeypatch, staged
):
    """Also with batches staged on the device, as on an accelerator (forced here):
    there the inline split is a stream too, reading `batch_at` in the plan's order."""
    import jaxnitro.loop.feed as feed

    monkeypatch.setattr(feed, "stages_on_device", lambda: staged)

    def trained(wrap):
        source = Shuffled()

        class OnSource(Tiny):
            def build_data(self, dist):
                return {"train": wrap(source)}

        nitro = nx.Nitro(OnSource(max_epochs=3), logger=None, checkpointer=None)
        nitro.train()
        return source.seeks, jax.tree.leaves(nitro.parameters)

    inline_seeks, inline = trained(nx.data.NoPrefetch)
    stream_seeks, streamed = trained(lambda s: s)
    assert inline_seeks[-3:] == stream_seeks[-3:] == [0, 1, 2]
    for a, b in zip(inline, streamed, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.needs_devices(4)
def test_a_staged_eval_chunk_is_split_over_the_mesh(monkeypatch):
    from jaxnitro.devices.placement import Placement
    from jaxnitro.loop import feed

    monkeypatch.setattr(feed, "stages_on_device", lambda: True)
    placement = Placement.build(n_devs=4, mode="replicated")
    source = nx.data.auto_prefetch({"s": make_batches(32, 16)})["s"]
    # (A training pass stages nothing here: the calls loop places whole blocks,
    # split along their batch axis: tests/loop/test_steps_per_call.py.)
    opened = feed.open_eval_feed(
        source, select=lambda keys: ("x",), width=16, name="s", placement=placement
    )
    try:  # read before closing: the stream deletes what it staged
        staged = next(iter(opened)).device["x"]
        assert staged.sharding == placement.data_sharding
        assert [s.data.shape for s in staged.addressable_shards] == [(4, 8)] * 4
    finally:
        opened.close()
