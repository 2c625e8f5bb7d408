"""The stacking buffers a train() reuses: never one still held, within their bounds."""

from __future__ import annotations

import gc

import jax
import numpy as np
import pytest
from experiments import Tiny, make_batches
from toy_sources import FannedOut

import jaxnitro as nx
import jaxnitro.loop.feed as feed
import jaxnitro.run.training as training
from jaxnitro.data.transfer import transfer
from jaxnitro.loop.blocks import stacked_block
from jaxnitro.loop.host_buffers import HostBuffers


def test_a_buffer_is_handed_out_again_only_once_nothing_holds_it():
    buffers = HostBuffers()
    first = buffers.empty((4, 3), np.float32)
    view = first[1:]  # a view holds its base
    first_id = id(first)
    del first
    second = buffers.empty((4, 3), np.float32)
    assert id(second) != first_id and buffers.reused == 0
    del view
    assert id(buffers.empty((4, 3), np.float32)) == first_id
    assert buffers.empty((4, 3), np.float32) is not second  # held here
    assert buffers.reused == 2


def test_a_buffer_whose_copy_to_the_device_is_alive_is_not_written():
    buffers = HostBuffers()
    host = buffers.empty((8, 5), np.float32)
    host[:] = 1.0
    placed = transfer({"x": host})["x"]
    host_id = id(host)
    del host
    again = buffers.empty((8, 5), np.float32)
    again[:] = 2.0  # had it been the first buffer, a copy reading it would change
    assert id(again) != host_id
    assert float(placed.sum()) == 40.0
    del again
    placed.delete()
    del placed
    gc.collect()
    assert id(buffers.empty((8, 5), np.float32)) == host_id


def test_the_pool_keeps_within_its_bounds():
    buffers = HostBuffers(per_shape=2, most_bytes=1000)
    held = [buffers.empty((10,), np.float32) for _ in range(3)]  # 40 bytes each
    assert sum(map(len, buffers._held.values())) == 2  # the third is not kept
    big = buffers.empty((300,), np.float32)  # 1200 bytes: never kept
    assert big.shape == (300,) and (300,) not in {k[0] for k in buffers._held}
    # A new shape makes room by dropping the others' buffers.
    other = buffers.empty((200,), np.float32)  # 800 bytes: 80 + 800 <= 1000
    assert ((200,), np.dtype(np.float32)) in buffers._held
    last = buffers.empty((240,), np.float32)  # 960 bytes: the others must go
    assert list(buffers._held) == [((240,), np.dtype(np.float32))]
    del held, other, last


def test_stacked_block_fills_a_reused_buffer_with_the_new_batches():
    buffers = HostBuffers()
    batches = [{"x": np.full((2, 3), i, np.float32)} for i in range(4)]
    first = stacked_block(batches[:2], 2, 1, 2, buffers=buffers)
    np.testing.assert_array_equal(first["x"][:, 0, 0], [0, 1])
    del first
    second = stacked_block(batches[2:], 2, 1, 2, buffers=buffers)
    assert buffers.reused == 1
    np.testing.assert_array_equal(second["x"][:, 0, 0], [2, 3])


@pytest.mark.parametrize("workers", [1, 2])
def test_a_staged_run_reuses_its_buffers_and_trains_as_with_fresh_ones(
    monkeypatch, workers
):
    """Staging forced (as on an accelerator): the prefetch thread stacks into the
    train()'s buffers; the weights are bitwise those of a run with fresh ones."""
    monkeypatch.setattr(feed, "stages_on_device", lambda: True)
    pools: list[HostBuffers] = []

    def recorded() -> HostBuffers:
        pools.append(HostBuffers())
        return pools[-1]

    def run(pool) -> list[np.ndarray]:
        monkeypatch.setattr(training, "HostBuffers", pool)
        batches = FannedOut(make_batches(16 * 12, 16))

        class Threaded(Tiny):
            def build_data(self, dist):
                return {"train": nx.data.PrefetchIterator(batches, workers=workers)}

        nitro = nx.Nitro(
            Threaded(max_epochs=3), logger=None, checkpointer=None, steps_per_call=4
        )
        nitro.train()
        return [np.asarray(a) for a in jax.tree.leaves(nitro.train_state.weights)]

    pooled = run(recorded)
    fresh = run(lambda: None)
    assert pools[0].reused > 0
    for a, b in zip(pooled, fresh, strict=True):
        np.testing.assert_array_equal(a, b)
