"""A prefetch stream's teardown on every exit path, its device memory and its stats."""

import threading

import jax
import numpy as np
import pytest
from toy_sources import (
    WAIT,
    Indexed,
    Sequential,
    drain,
    live_arrays,
    named_prepare,
    prefetch_threads,
    surviving_threads,
)

from jaxnitro.data.prefetch import (
    NoPrefetch,
    PrefetchIterator,
    batch_stream,
    prepared_stream,
)
from jaxnitro.data.stream import Staged, StreamStats
from jaxnitro.data.transfer import transfer
from jaxnitro.errors import NitroWarning

# --- teardown on every exit path --------------------------------------------------


@pytest.mark.parametrize(
    "split",
    [
        PrefetchIterator(Indexed(n_batches=8), workers=3),
        PrefetchIterator(Sequential(8), workers=1),
        PrefetchIterator([{"x": np.ones((2, 2))}] * 8),
        NoPrefetch(Indexed(n_batches=8)),
    ],
    ids=["fanout", "single", "materialized", "inline"],
)
def test_every_exit_path_leaves_no_thread_and_no_device_batch(clean, split):
    # Completion.
    stream = batch_stream(split, ("x",))
    assert len(drain(stream, "x")) == 8
    # An early stop (request_stop, a non-finite loss) without releasing the batch.
    stream = batch_stream(split, ("x",))
    next(stream)
    stream.close()
    stream.close()  # idempotent
    with pytest.raises(StopIteration):
        next(stream)
    # An error in the consumer's step.
    with pytest.raises(KeyError), batch_stream(split, ("x",)) as stream:
        for _ in stream:
            raise KeyError("the step failed")
    # Closed before the first batch, and while the transfer waits on a full channel.
    batch_stream(split, ("x",)).close()
    # Abandoned mid-epoch, never closed: closed when collected.
    stream = batch_stream(split, ("x",))
    next(stream)
    del stream


def test_close_without_waiting_joins_only_the_device_holding_thread(clean):
    release = threading.Event()
    started = threading.Event()

    class Slow(Indexed):
        def batch_at(self, i, plan=None):
            started.set()
            release.wait(WAIT)
            return super().batch_at(i, plan)

    stream = batch_stream(PrefetchIterator(Slow(), workers=2), ("x",))
    assert started.wait(WAIT)
    stream.close(wait=False)  # returns while the workers are still inside batch_at
    assert not stream.threads[-1].is_alive()  # the transfer thread
    release.set()
    for thread in stream.threads:
        thread.join(WAIT)
    assert prefetch_threads() == []


@pytest.mark.parametrize("stage", [True, False], ids=["staged", "unstaged"])
def test_close_does_not_wait_for_workers_inside_a_slow_batch_at(clean, stage):
    """The spec's close_stream!: an early exit closes every channel and joins only
    the thread that holds device memory; a worker in a slow batch_at exits on its
    own once its batch is built."""
    release = threading.Event()
    started = threading.Event()

    class Slow(Indexed):
        def batch_at(self, i, plan=None):
            if i > 0:
                started.set()
                release.wait(WAIT)
            return super().batch_at(i, plan)

    def staged(host):
        return [Staged(host, transfer({"x": host["x"]}))]

    stream = prepared_stream(
        PrefetchIterator(Slow(n_batches=8), workers=3),
        staged if stage else named_prepare,
        stage=stage,
        join_timeout=0.5,  # had close() waited for them, it would warn: an error
    )
    next(stream)
    assert started.wait(WAIT)
    stream.close()  # as the loop closes it on a stop request or an error
    workers = [t for t in stream.threads if "worker" in t.name]
    assert any(t.is_alive() for t in workers)  # still inside batch_at
    assert not [t for t in stream.threads if t not in workers and t.is_alive()]
    release.set()
    assert surviving_threads() == []


def test_close_warns_about_a_thread_that_does_not_stop(clean):
    release = threading.Event()
    started = threading.Event()

    class Stuck(Indexed):
        def batch_at(self, i, plan=None):
            started.set()
            release.wait(WAIT)
            return super().batch_at(i, plan)

    stream = prepared_stream(
        PrefetchIterator(Stuck(), workers=2),
        lambda host: [Staged(host, transfer({"x": host["x"]}))],
        join_timeout=0.01,
    )
    assert started.wait(WAIT)
    with pytest.warns(NitroWarning, match=r"did not stop within 0\.01 s"):
        stream.close(wait=True)  # joins the workers too
    release.set()
    for thread in stream.threads:
        thread.join(WAIT)


# --- device memory ---------------------------------------------------------------


@pytest.mark.parametrize("device_batches", [1, 2])
@pytest.mark.parametrize("workers", [1, 3])
def test_device_residency_is_bounded(clean, device_batches, workers):
    split = PrefetchIterator(
        Indexed(n_batches=10), workers=workers, device_batches=device_batches
    )
    base = live_arrays()
    bound = device_batches + 2
    with batch_stream(split, ("x", "i")) as stream:
        for _host, device in stream:
            assert live_arrays() - base <= bound * 2  # two routed fields per batch
            stream.release(device)
    assert stream.stats().peak_live <= bound


def test_unreleased_batches_are_counted_and_freed_at_close(clean):
    with batch_stream(PrefetchIterator(Indexed(n_batches=5), workers=2), ("x",)) as s:
        held = [device for _host, device in s]
    assert s.stats().peak_live == 5
    assert all(d["x"].is_deleted() for d in held)


def test_the_sources_own_device_arrays_are_never_deleted(clean):
    on_device = [{"x": jax.device_put(np.ones((2, 2)))} for _ in range(3)]
    with batch_stream(PrefetchIterator(on_device), ("x",)) as stream:
        drain(stream, "x")
    assert not any(b["x"].is_deleted() for b in on_device)
    for batch in on_device:
        batch["x"].delete()


def test_stats_measure_the_wait():
    stats = StreamStats(batches=4, wait_seconds=0.5, elapsed_seconds=2.0, peak_live=1)
    assert stats.data_wait_frac() == 0.25 and stats.data_wait_frac(1.0) == 0.5
    with batch_stream(PrefetchIterator([{"x": np.ones((1, 1))}] * 3), ("x",)) as s:
        drain(s, "x")
    measured = s.stats()
    assert (
        measured.batches == 3 and 0 <= measured.wait_seconds <= measured.elapsed_seconds
    )
