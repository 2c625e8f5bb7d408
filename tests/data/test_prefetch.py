"""The prefetch pipeline: settings, paths, ordering, errors, teardown, memory."""

import os
import threading
import time
import traceback

import jax
import numpy as np
import pytest
from toy_sources import (
    WAIT,
    Indexed,
    Sequential,
    drain,
    named_prepare,
    prefetch_threads,
    surviving_threads,
)

from jaxnitro.data.prefetch import (
    NoPrefetch,
    PrefetchConfig,
    PrefetchIterator,
    auto_prefetch,
    batch_stream,
    check_prefetch,
    default_prefetch_workers,
    eval_stream,
    prefetch_config,
    prefetch_report,
    prepared_stream,
)
from jaxnitro.data.stream import Staged
from jaxnitro.data.transfer import transfer
from jaxnitro.errors import ConfigError, NitroWarning, RoutingError

# --- settings, validated when constructed --------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"device_batches": 0},
            "`device_batches` must be >= 1, got 0. To run a split's host data path "
            "inline on the training thread, wrap it in NoPrefetch(source) instead",
        ),
        ({"device_batches": -1}, "`device_batches` must be >= 1, got -1."),
        ({"workers": 0}, "`workers` must be >= 1, got 0."),
        ({"workers": True}, "`workers` must be an int, got True."),
        (
            {"workers": 4, "host_batches": 2},
            "`host_batches` must be >= `workers` (4), got 2: each worker needs a host "
            "slot",
        ),
        ({"host_batches": 0}, "`host_batches` must be >= 1, got 0."),
        ({"ordered": 1}, "`ordered` must be True or False, got 1."),
    ],
)
def test_settings_are_validated_when_constructed(kwargs, message):
    with pytest.raises(ConfigError) as info:
        PrefetchIterator([], **kwargs)
    assert str(info.value).startswith(message)


def test_host_batches_message_explains_the_deadlock():
    with pytest.raises(ConfigError, match="deadlock waiting on a batch that was never"):
        PrefetchIterator([], workers=3, host_batches=2)


def test_a_split_is_wrapped_once():
    with pytest.raises(ConfigError, match="already wrapped in PrefetchIterator"):
        NoPrefetch(PrefetchIterator([]))


@pytest.mark.parametrize(("cores", "workers"), [(1, 3), (2, 4), (6, 8), (64, 8)])
def test_default_workers_are_the_cores_plus_two_at_most_eight(
    monkeypatch, cores, workers
):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    assert default_prefetch_workers() == workers
    assert PrefetchIterator([]).workers == workers


def test_defaults_and_pass_through():
    split = PrefetchIterator(Sequential(3))
    workers = default_prefetch_workers()
    assert 3 <= workers <= 8
    assert (split.workers, split.device_batches, split.host_batches) == (
        workers,
        1,
        2 * workers,
    )
    assert len(split) == 3 and len(list(split)) == 3  # iterating starts no thread
    assert prefetch_threads() == []


# --- paths ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("split", "expected"),
    [
        ([{"x": np.zeros(1)}], PrefetchConfig(1, 1, 1, True, "materialized")),
        (
            PrefetchIterator((), workers=3),
            PrefetchConfig(1, 1, 1, True, "materialized"),
        ),
        (
            PrefetchIterator(Indexed(), workers=2),
            PrefetchConfig(1, 4, 2, True, "fanout"),
        ),
        (
            PrefetchIterator(Indexed(), workers=3, host_batches=5, ordered=False),
            PrefetchConfig(1, 5, 3, False, "fanout_unordered"),
        ),
        (
            PrefetchIterator(Indexed(), workers=1),
            PrefetchConfig(1, 1, 1, True, "single"),
        ),
        (
            PrefetchIterator(Sequential(), workers=2, device_batches=3),
            PrefetchConfig(3, 1, 1, True, "single_no_trait"),
        ),
        (NoPrefetch(Indexed()), PrefetchConfig(0, 0, 0, True, "inline")),
    ],
)
def test_prefetch_config_reports_the_path(split, expected):
    assert prefetch_config(split) == expected


def test_auto_prefetch_wraps_bare_splits_only():
    keep = NoPrefetch(Sequential())
    tuned = PrefetchIterator(Indexed(), workers=3)
    wrapped = auto_prefetch({"train": Indexed(), "val": keep, "test": tuned})
    assert isinstance(wrapped["train"], PrefetchIterator)
    assert wrapped["val"] is keep and wrapped["test"] is tuned


def test_train_split_without_the_trait_warns_naming_both_methods():
    data = auto_prefetch({"train": Sequential(), "val": Sequential()}, workers=2)
    with pytest.warns(NitroWarning) as record:
        configs = check_prefetch(data)
    assert len(record) == 1  # the val split does not warn
    message = str(record[0].message)
    assert message.startswith("The train split (Sequential) runs in ONE producer")
    assert "lacks `begin_epoch` and `batch_at`" in message
    assert configs["val"].path == "single_no_trait"


def test_lists_and_capable_sources_never_warn():
    data = auto_prefetch({"train": [{"x": np.zeros((2, 1))}], "val": Indexed()})
    configs = check_prefetch(data)  # warnings are errors in this suite
    assert [c.path for c in configs.values()] == ["materialized", "fanout"]
    assert prefetch_report(configs["val"])["prefetch_workers"] == configs["val"].workers


# --- ordering ---------------------------------------------------------------------


def _epochs(split, epochs=3):
    out = []
    for epoch in range(epochs):
        with batch_stream(split, ("x",), epoch=epoch) as stream:
            for _host, device in stream:
                out.append(np.asarray(device["x"]).copy())
                stream.release(device)
    return np.stack(out)


def test_ordered_delivery_is_identical_at_1_2_and_4_workers(clean):
    runs = [_epochs(PrefetchIterator(Indexed(), workers=w)) for w in (1, 2, 4)]
    np.testing.assert_array_equal(runs[0], runs[1])
    np.testing.assert_array_equal(runs[0], runs[2])
    assert not np.array_equal(runs[0][:4], runs[0][4:8])  # epochs reshuffle


class Gated:
    """Batch 0 is built only after batch 1: completion order is out of order."""

    def __init__(self, n=6, gate=None):
        self.n = n
        self.built = []
        self.gate = gate or threading.Event()
        self.own_gate = gate is None

    def __len__(self):
        return self.n

    def begin_epoch(self):
        return None

    def batch_at(self, i):
        if i == 0 and not self.gate.wait(WAIT):
            raise TimeoutError("batch 1 was never built")
        self.built.append(i)
        if i == 1 and self.own_gate:
            self.gate.set()
        return {"i": np.array([i], np.int32)}

    def __iter__(self):
        return (self.batch_at(i) for i in range(self.n))


def test_the_reorder_buffer_delivers_in_source_order(clean):
    source = Gated()
    with batch_stream(PrefetchIterator(source, workers=2), ("i",)) as stream:
        delivered = drain(stream)
    assert source.built.index(1) < source.built.index(0)  # finished out of order
    assert delivered == [[i] for i in range(6)]


def test_unordered_delivers_each_batch_exactly_once(clean):
    gate = threading.Event()
    source = Gated(n=8, gate=gate)

    def prepare(host):
        staged = [Staged(host, transfer({"i": host["i"]}))]
        if host["i"][0] == 1:  # batch 0 may only be built once 1 is staged
            gate.set()
        return staged

    split = PrefetchIterator(source, workers=3, ordered=False)
    with prepared_stream(split, prepare) as stream:
        delivered = [i for [i] in drain(stream)]
    assert delivered[0] == 1  # delivered as finished, not in order
    assert sorted(delivered) == list(range(8))


def test_unordered_epochs_hold_every_batch_once(clean):
    split = PrefetchIterator(Indexed(n_batches=6), workers=4, ordered=False)
    for epoch in range(3):
        with batch_stream(split, ("x",), epoch=epoch) as stream:
            seen = sorted(i[0] for i in drain(stream))
        assert seen == list(range(6))


# --- without staging: the workers prepare, the consumer reads them directly --------


def _unstaged(split, epoch=0):
    with prepared_stream(split, named_prepare, epoch=epoch, stage=False) as stream:
        items = list(stream)
        threads = [t.name for t in stream.threads]
    return items, threads


@pytest.mark.parametrize("workers", [2, 4])
def test_without_staging_the_workers_prepare_and_order_holds(clean, workers):
    split = PrefetchIterator(Indexed(), workers=workers)
    staged = _epochs(split)
    unstaged = []
    for epoch in range(3):
        items, threads = _unstaged(split, epoch)
        assert {name for name, _ in items} <= set(threads)
        assert all("worker" in name for name in threads)  # no transfer thread
        unstaged += [host["x"] for _, host in items]
    np.testing.assert_array_equal(staged, np.stack(unstaged))


def test_without_staging_unordered_delivers_each_batch_once(clean):
    split = PrefetchIterator(Indexed(n_batches=9), workers=3, ordered=False)
    items, _ = _unstaged(split)
    assert sorted(int(host["i"][0]) for _, host in items) == list(range(9))


def test_without_staging_a_prepare_error_reaches_the_consumer(clean):
    split = PrefetchIterator(Indexed(), workers=2)
    stream = prepared_stream(split, _failing_prepare, stage=False)
    with pytest.raises(RuntimeError, match="the transfer failed") as info:
        next(stream)
    assert "_failing_prepare" in [
        f.name for f in traceback.extract_tb(info.value.__traceback__)
    ]
    assert "jaxnitro-prefetch-split-worker-" in info.value.__notes__[0]
    stream.close()


def test_without_staging_an_early_close_stops_every_thread(clean):
    stream = prepared_stream(
        PrefetchIterator(Indexed(n_batches=8), workers=3), named_prepare, stage=False
    )
    next(stream)
    stream.close()
    with pytest.raises(StopIteration):
        next(stream)


class Jittery:
    """A fan-out source whose batches take a random 0-2 ms; one may fail."""

    def __init__(self, n, rng, fail_at=None):
        self.n, self.fail_at = n, fail_at
        self.delays = rng.uniform(0, 0.002, size=n)

    def __len__(self):
        return self.n

    def begin_epoch(self):
        return None

    def batch_at(self, i):
        time.sleep(self.delays[i])
        if i == self.fail_at:
            raise ValueError(f"batch {i} is corrupt")
        return {"i": np.array([i])}


def test_random_fanout_passes_deliver_everything_or_fail_cleanly(clean):
    """Worker counts, credits, order, staging, errors and early stops drawn at random:
    every pass delivers each batch once (in order when ordered) or raises the worker's
    error, and leaves no thread and no device buffer behind."""
    rng = np.random.default_rng(7)
    for _ in range(40):
        n, workers = int(rng.integers(1, 20)), int(rng.integers(2, 6))
        ordered, stage = bool(rng.random() < 0.5), bool(rng.random() < 0.5)
        fail_at = int(rng.integers(0, n)) if rng.random() < 0.2 else None
        stop_at = int(rng.integers(0, n + 1)) if rng.random() < 0.2 else None
        split = PrefetchIterator(
            Jittery(n, rng, fail_at),
            workers=workers,
            host_batches=int(rng.integers(workers, 3 * workers + 1)),
            ordered=ordered,
        )

        def prepare(host, stage=stage):
            routed = {"i": host["i"]}
            return [Staged(host, transfer(routed) if stage else routed)]

        seen, raised = [], None
        with prepared_stream(split, prepare, stage=stage) as stream:
            try:
                for k, item in enumerate(stream):
                    if k == stop_at:
                        break
                    seen.append(int(item.host["i"][0]))
                    stream.release(item.device)
            except ValueError as error:
                raised = error
        if fail_at is not None and raised is not None:
            assert str(raised) == f"batch {fail_at} is corrupt"
        elif stop_at is None:
            assert raised is None
            assert seen == list(range(n)) if ordered else sorted(seen) == list(range(n))
        assert surviving_threads() == []


# --- errors travel to the consumer ------------------------------------------------


def _explode(i):
    raise ValueError(f"cannot decode batch {i}")


class Exploding(Indexed):
    def batch_at(self, i, plan=None):
        if i == 2:
            _explode(i)
        return super().batch_at(i, plan)


@pytest.mark.parametrize("workers", [1, 3])
def test_a_worker_error_is_raised_on_the_consumer_with_its_traceback(clean, workers):
    split = PrefetchIterator(Exploding(n_batches=8), workers=workers)
    stream = batch_stream(split, ("x",))
    with pytest.raises(ValueError, match="cannot decode batch 2") as info:
        drain(stream)
    frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert "_explode" in frames and "batch_at" in frames
    assert any("re-raised on the consumer" in n for n in info.value.__notes__)
    with pytest.raises(ValueError):  # the stream stays failed
        next(stream)


def test_an_inline_error_is_raised_directly(clean):
    stream = batch_stream(NoPrefetch(Exploding()), ("x",))
    with pytest.raises(ValueError) as info:
        drain(stream)
    assert "_explode" in [
        f.name for f in traceback.extract_tb(info.value.__traceback__)
    ]
    with pytest.raises(ValueError):  # the stream stays failed
        next(stream)


def _failing_prepare(host):
    raise RuntimeError("the transfer failed")


def test_a_transfer_thread_error_is_raised_with_its_traceback(clean):
    stream = prepared_stream(PrefetchIterator(Indexed(), workers=2), _failing_prepare)
    with pytest.raises(RuntimeError, match="the transfer failed") as info:
        next(stream)
    frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert "_failing_prepare" in frames and "transfer" in frames


def test_a_batch_jax_cannot_hold_is_refused_naming_the_field(clean):
    batches = [{"s": np.array(["a", "b"])}]
    with pytest.raises(
        RoutingError, match="Batch field `s` of split `train` has dtype"
    ):
        drain(batch_stream(PrefetchIterator(batches), ("s",)))


def test_a_batch_missing_a_routed_field_names_it(clean):
    batches = [{"x": np.zeros((2, 1))}, {"y": np.zeros((2, 1))}]
    with pytest.raises(RoutingError, match="split `train` has no field `x`"):
        drain(batch_stream(PrefetchIterator(batches), ("x",)))


def test_batch_at_returning_none_is_refused(clean):
    class Holes(Indexed):
        def batch_at(self, i, plan=None):
            return None if i == 1 else super().batch_at(i, plan)

    with pytest.raises(ConfigError, match=r"batch_at\(1\) of split `train` \(Holes\)"):
        drain(batch_stream(PrefetchIterator(Holes(), workers=2), ("x",)))


# --- the training and evaluation payloads ----------------------------------------


def test_batch_stream_transfers_the_routed_fields_only(clean):
    with batch_stream(PrefetchIterator(Indexed(), workers=2), ("x",)) as stream:
        host, device = next(stream)
        assert set(host) == {"x", "i"} and set(device) == {"x"}
        assert isinstance(device["x"], jax.Array)
        np.testing.assert_array_equal(np.asarray(device["x"]), host["x"])


def test_eval_stream_pads_before_the_transfer_and_hands_on_the_unpadded_batch(clean):
    batches = [
        {"x": np.arange(8.0).reshape(4, 2), "id": np.arange(4)},
        {"x": np.arange(10.0, 12.0).reshape(1, 2), "id": np.array([4])},
    ]
    with eval_stream(PrefetchIterator(batches), ("x",), 4) as stream:
        items = [
            (item.host, np.asarray(item.device["x"]), item.n_real) for item in stream
        ]
    assert [n for *_, n in items] == [4, 1]
    host, padded, _ = items[1]
    assert host["x"].shape == (1, 2) and set(host) == {"x", "id"}
    np.testing.assert_array_equal(padded, np.repeat([[10.0, 11.0]], 4, axis=0))


def test_eval_stream_cuts_a_wider_batch_into_chunks(clean):
    batches = [{"x": np.arange(10.0)[:, None], "id": np.arange(10)}]
    with eval_stream(NoPrefetch(batches), ("x",), 4) as stream:
        chunks = [(item.host["id"].tolist(), item.n_real) for item in stream]
    assert chunks == [([0, 1, 2, 3], 4), ([4, 5, 6, 7], 4), ([8, 9], 2)]


# --- how a pass off the fan-out reads a source ------------------------------------


class ReplansInIter:
    """`batch_at` alone, its plan (a permutation) drawn anew in each `__iter__`."""

    def __init__(self, n_batches=4, bs=3):
        self.n, self.bs = n_batches, bs
        self.rng = np.random.default_rng(0)
        self.perm = np.arange(n_batches * bs)
        self.iters = 0

    def __len__(self):
        return self.n

    def batch_at(self, i):
        rows = self.perm[i * self.bs : (i + 1) * self.bs]
        return {"x": rows.astype(np.float32), "i": np.full(self.bs, i, np.int32)}

    def __iter__(self):
        self.iters += 1
        self.perm = self.rng.permutation(self.n * self.bs)
        return (self.batch_at(i) for i in range(self.n))


def test_an_inline_source_with_batch_at_alone_is_iterated_so_it_replans(clean):
    source = ReplansInIter()
    passes = [
        sum(drain(batch_stream(NoPrefetch(source), ("x",)), field="x"), [])
        for _ in range(2)
    ]
    assert source.iters == 2
    assert passes[0] != passes[1]  # each pass its own permutation
    assert [sorted(rows) for rows in passes] == [list(range(12))] * 2
