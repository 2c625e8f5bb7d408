"""The prefetch pipeline: settings, paths, ordering, errors, teardown, memory."""

import gc
import os
import threading
import time
import traceback

import jax
import numpy as np
import pytest

from jaxnitro.data.batch_at_check import check_batch_at
from jaxnitro.data.channel import Channel, ChannelClosed
from jaxnitro.data.pipeline import END, Coordinator
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
from jaxnitro.data.protocol import (
    BatchSource,
    IndexedSource,
    epoch_token,
    fanout_capable,
    release_splits,
)
from jaxnitro.data.sources import check_split
from jaxnitro.data.stream import Staged, StreamStats
from jaxnitro.data.transfer import transfer
from jaxnitro.errors import ConfigError, NitroWarning, RoutingError

WAIT = 10.0  # seconds an Event may take before a test calls the pipeline broken


class Indexed:
    """A fan-out source: 4 batches of 3 rows, each epoch a permutation of (seed, e)."""

    def __init__(self, n_batches=4, bs=3, seed=0):
        self.bs, self.n, self.seed = bs, n_batches, seed
        self.x = np.arange(n_batches * bs * 2, dtype=np.float32).reshape(-1, 2)
        self.epoch_token = 0
        self._epoch = 0

    def __len__(self):
        return self.n

    def set_epoch(self, epoch):
        self._epoch = epoch

    def begin_epoch(self):
        rng = np.random.default_rng([self.seed, self._epoch])
        self._epoch += 1
        self.epoch_token += 1
        return rng.permutation(len(self.x))

    def batch_at(self, i, plan=None):
        rows = plan[i * self.bs : (i + 1) * self.bs]
        return {"x": self.x[rows], "i": np.full(self.bs, i, np.int32)}

    def __iter__(self):
        plan = self.begin_epoch()
        for i in range(len(self)):
            yield self.batch_at(i, plan)


class Sequential:
    """A sized, restartable iterable without the trait."""

    def __init__(self, n=5):
        self.n = n

    def __len__(self):
        return self.n

    def __iter__(self):
        for i in range(self.n):
            yield {"x": np.full((2, 2), i, np.float32), "i": np.full(2, i, np.int32)}


def _threads():
    return [t for t in threading.enumerate() if t.name.startswith("jaxnitro-prefetch")]


def _exited(timeout=WAIT):
    """The prefetch threads still alive after `timeout` seconds to exit on their own:
    a closed stream joins only the thread holding device memory, and its workers
    leave after their current batch."""
    deadline = time.monotonic() + timeout
    while _threads() and time.monotonic() < deadline:
        time.sleep(0.001)
    return _threads()


def _live():
    return len(jax.live_arrays())


def _drain(stream, field="i"):
    seen = []
    for item in stream:
        seen.append(np.asarray(item.host[field]).tolist())
        stream.release(item.device)
    return seen


@pytest.fixture
def clean():
    """Assert a test leaves no prefetch thread and no device array behind."""
    gc.collect()  # arrays earlier tests dropped would otherwise vanish mid-test
    live = _live()
    yield
    assert _exited() == []
    gc.collect()
    assert _live() == live


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
    assert _threads() == []


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


def test_protocols_and_fanout_capable():
    assert isinstance(Indexed(), IndexedSource) and isinstance(
        Sequential(), BatchSource
    )
    assert fanout_capable(Indexed()) and fanout_capable(PrefetchIterator(Indexed()))
    assert not fanout_capable(Sequential()) and not fanout_capable([])


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
        delivered = _drain(stream)
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
        delivered = [i for [i] in _drain(stream)]
    assert delivered[0] == 1  # delivered as finished, not in order
    assert sorted(delivered) == list(range(8))


def test_unordered_epochs_hold_every_batch_once(clean):
    split = PrefetchIterator(Indexed(n_batches=6), workers=4, ordered=False)
    for epoch in range(3):
        with batch_stream(split, ("x",), epoch=epoch) as stream:
            seen = sorted(i[0] for i in _drain(stream))
        assert seen == list(range(6))


# --- without staging: the workers prepare, the consumer reads them directly --------


def _named_prepare(host):
    """A prepare that stages nothing (the CPU loop's) and says which thread ran it."""
    return [(threading.current_thread().name, host)]


def _unstaged(split, epoch=0):
    with prepared_stream(split, _named_prepare, epoch=epoch, stage=False) as stream:
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
        PrefetchIterator(Indexed(n_batches=8), workers=3), _named_prepare, stage=False
    )
    next(stream)
    stream.close()
    with pytest.raises(StopIteration):
        next(stream)


def test_the_coordinator_hands_out_no_more_indices_than_its_credits():
    coordinator = Coordinator(count=5, host_batches=2, ordered=True)
    assert [coordinator.claim(), coordinator.claim()] == [0, 1]
    claimed = []
    waiting = threading.Thread(target=lambda: claimed.append(coordinator.claim()))
    waiting.start()
    waiting.join(0.05)
    assert waiting.is_alive() and claimed == []  # both credits are out
    coordinator.put(1, "b1")
    coordinator.put(0, "b0")
    assert coordinator.take() == "b0"  # in index order; its credit goes back
    waiting.join(0.05)
    assert claimed == []  # ... but the workers hear of it only from wake()
    coordinator.wake()
    waiting.join(WAIT)
    assert claimed == [2]
    assert coordinator.take() == "b1"
    coordinator.put(2, "b2")
    assert coordinator.take() == "b2"
    assert [coordinator.claim(), coordinator.claim()] == [3, 4]
    assert coordinator.claim() is None  # every index handed out
    coordinator.put(4, "b4")
    coordinator.put(3, "b3")
    assert [coordinator.take(), coordinator.take()] == ["b3", "b4"]
    assert coordinator.take() is END


def _two_workers_waiting(count):
    """A coordinator with both of its 2 credits built, and two workers blocked in
    claim(): returns it, the indices they claim (appended) and their threads."""
    coordinator = Coordinator(count=count, host_batches=2, ordered=True)
    for index in (coordinator.claim(), coordinator.claim()):
        coordinator.put(index, f"b{index}")
    claimed = []
    waiting = [
        threading.Thread(target=lambda: claimed.append(coordinator.claim()))
        for _ in range(2)
    ]
    for thread in waiting:
        thread.start()
    deadline = time.monotonic() + WAIT  # both blocked before any credit comes back
    while len(coordinator._room._waiters) < 2 and time.monotonic() < deadline:
        time.sleep(0.001)
    return coordinator, claimed, waiting


def test_a_take_with_no_wake_after_the_last_wakes_one_worker_itself():
    coordinator, claimed, waiting = _two_workers_waiting(6)
    assert coordinator.take() == "b0"  # a credit is free, nobody woken yet
    time.sleep(0.05)
    assert claimed == []
    assert coordinator.take() == "b1"  # the consumer never called wake(): this take
    deadline = time.monotonic() + WAIT  # woke ONE worker for the first credit
    while not claimed and time.monotonic() < deadline:
        time.sleep(0.001)
    time.sleep(0.05)
    assert claimed == [2]
    coordinator.wake()  # the second take's credit
    for thread in waiting:
        thread.join(WAIT)
    assert claimed == [2, 3]


def test_a_taker_with_nothing_ready_wakes_every_worker():
    coordinator, claimed, waiting = _two_workers_waiting(4)
    assert [coordinator.take(), coordinator.take()] == ["b0", "b1"]
    taken = []
    taker = threading.Thread(target=lambda: taken.append(coordinator.take()))
    taker.start()  # batch 2 is not built: both workers are woken, no wake() needed
    for thread in waiting:
        thread.join(WAIT)
    assert sorted(claimed) == [2, 3]
    coordinator.put(2, "b2")
    taker.join(WAIT)
    assert taken == ["b2"]


def test_closing_the_coordinator_wakes_its_waiters():
    coordinator = Coordinator(count=3, host_batches=1, ordered=True)
    coordinator.claim()
    errors = []

    def wait(call):
        try:
            call()
        except ChannelClosed:
            errors.append(call.__name__)

    threads = [
        threading.Thread(target=wait, args=(f,))
        for f in (coordinator.claim, coordinator.take)
    ]
    for thread in threads:
        thread.start()
    coordinator.put(1, "not yet takeable")  # the taker waits for index 0
    assert coordinator.close() == ["not yet takeable"]
    for thread in threads:
        thread.join(WAIT)
    assert sorted(errors) == ["claim", "take"]


def test_a_channel_refills_in_bursts_when_woken_and_delivers_everything_in_order():
    channel = Channel(4)
    producer = threading.Thread(target=lambda: [channel.put(i) for i in range(50)])
    producer.start()
    deadline = time.monotonic() + WAIT
    while len(channel) < 4 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert channel.get() == 0
    time.sleep(0.05)
    assert len(channel) == 3  # one slot free: the blocked producer sleeps on
    assert channel.get() == 1  # half free: the producer is due ...
    time.sleep(0.05)
    assert len(channel) == 2  # ... and woken only by wake(), or by the next get
    channel.wake()
    while len(channel) < 4 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert len(channel) == 4
    assert [channel.get() for _ in range(48)] == list(range(2, 50))
    producer.join(WAIT)
    assert not producer.is_alive()


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
        assert _exited() == []


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
        _drain(stream)
    frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert "_explode" in frames and "batch_at" in frames
    assert any("re-raised on the consumer" in n for n in info.value.__notes__)
    with pytest.raises(ValueError):  # the stream stays failed
        next(stream)


def test_an_inline_error_is_raised_directly(clean):
    stream = batch_stream(NoPrefetch(Exploding()), ("x",))
    with pytest.raises(ValueError) as info:
        _drain(stream)
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
        _drain(batch_stream(PrefetchIterator(batches), ("s",)))


def test_transfer_places_host_arrays_and_keeps_device_ones(clean):
    on_device = jax.device_put(np.ones(3, np.float32))
    placed = transfer({"a": np.arange(3.0), "b": on_device})
    assert placed["b"] is on_device and isinstance(placed["a"], jax.Array)
    np.testing.assert_array_equal(np.asarray(placed["a"]), np.arange(3.0))
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[1])
    assert transfer({"a": np.zeros(2)}, sharding)["a"].devices() == {jax.devices()[1]}
    assert transfer({"a": np.zeros(2)}, jax.devices()[2])["a"].devices() == {
        jax.devices()[2]
    }
    for array in (*placed.values(),):
        array.delete()


def test_a_batch_missing_a_routed_field_names_it(clean):
    batches = [{"x": np.zeros((2, 1))}, {"y": np.zeros((2, 1))}]
    with pytest.raises(RoutingError, match="split `train` has no field `x`"):
        _drain(batch_stream(PrefetchIterator(batches), ("x",)))


def test_batch_at_returning_none_is_refused(clean):
    class Holes(Indexed):
        def batch_at(self, i, plan=None):
            return None if i == 1 else super().batch_at(i, plan)

    with pytest.raises(ConfigError, match=r"batch_at\(1\) of split `train` \(Holes\)"):
        _drain(batch_stream(PrefetchIterator(Holes(), workers=2), ("x",)))


def test_a_begin_epoch_that_does_not_advance_the_token_is_refused(clean):
    class Stale(Indexed):
        def begin_epoch(self):
            plan = super().begin_epoch()
            self.epoch_token -= 1
            return plan

    with pytest.raises(ConfigError, match="moved epoch_token from 0 to 0"):
        batch_stream(PrefetchIterator(Stale(), workers=2), ("x",))


def test_a_numpy_integer_epoch_token_is_checked_and_a_bool_is_no_token(clean):
    class NumpyStale(Indexed):
        def __init__(self):
            super().__init__()
            self.epoch_token = np.int64(0)

        def begin_epoch(self):
            plan = super().begin_epoch()
            self.epoch_token -= 1  # still an np.int64, which never advances
            return plan

    with pytest.raises(ConfigError, match="moved epoch_token from 0 to 0"):
        batch_stream(PrefetchIterator(NumpyStale(), workers=2), ("x",))
    advancing = Indexed()
    advancing.epoch_token = np.int32(4)
    assert len(_drain(batch_stream(PrefetchIterator(advancing, workers=2), ("x",))))
    assert epoch_token(advancing) == 5 and type(epoch_token(advancing)) is int
    for flag in (True, np.True_):
        advancing.epoch_token = flag
        assert epoch_token(advancing) is None


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
    assert len(_drain(stream, "x")) == 8
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
    assert _threads() == []


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
        staged if stage else _named_prepare,
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
    assert _exited() == []


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
    base = _live()
    bound = device_batches + 2
    with batch_stream(split, ("x", "i")) as stream:
        for _host, device in stream:
            assert _live() - base <= bound * 2  # two routed fields per batch
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
        _drain(stream, "x")
    assert not any(b["x"].is_deleted() for b in on_device)
    for batch in on_device:
        batch["x"].delete()


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


def test_stats_measure_the_wait():
    stats = StreamStats(batches=4, wait_seconds=0.5, elapsed_seconds=2.0, peak_live=1)
    assert stats.data_wait_frac() == 0.25 and stats.data_wait_frac(1.0) == 0.5
    with batch_stream(PrefetchIterator([{"x": np.ones((1, 1))}] * 3), ("x",)) as s:
        _drain(s, "x")
    measured = s.stats()
    assert (
        measured.batches == 3 and 0 <= measured.wait_seconds <= measured.elapsed_seconds
    )


# --- check_batch_at ---------------------------------------------------------------


class Loader:
    """The spec's loader: `batch_at(k)` either RIGHT (batch index) or WRONG (sample)."""

    def __init__(self, n=24, bs=4, wrong=False):
        self.x = np.arange(n, dtype=np.float32)
        self.bs, self.wrong = bs, wrong

    def __len__(self):
        return len(self.x) // self.bs

    def _build(self, start):
        return {"x": self.x[start : start + self.bs]}

    def begin_epoch(self):
        return None

    def batch_at(self, k, plan=None):
        return self._build(k if self.wrong else k * self.bs)

    def __iter__(self):
        self.begin_epoch()
        return (self._build(k * self.bs) for k in range(len(self)))


@pytest.mark.parametrize("values", [False, True])
def test_check_batch_at_catches_sample_offsets(values):
    check_batch_at(Loader(), values=values)
    with pytest.raises(ConfigError, match="looks like it takes a SAMPLE offset"):
        check_batch_at(Loader(wrong=True), values=values)


def test_check_batch_at_catches_a_batch_at_that_ignores_the_plan():
    class StoresPlan(Indexed):
        def begin_epoch(self):
            self.plan = super().begin_epoch()
            return self.plan

        def batch_at(self, i, plan=None):
            return super().batch_at(i, self.plan)  # reads its own, not the argument

    check_batch_at(Indexed(), values=True)
    check_batch_at(StoresPlan())  # names and sizes agree
    with pytest.raises(ConfigError, match=r"ignores the plan it is passed"):
        check_batch_at(StoresPlan(), values=True)


def test_check_batch_at_compares_sizes_and_counts():
    class Partial(Loader):  # iter() keeps a short last batch, batch_at does not
        def __len__(self):
            return 3

        def batch_at(self, k, plan=None):
            return {"x": np.zeros(4, np.float32) + k}

        def __iter__(self):
            return iter(
                [{"x": np.zeros(4, np.float32) + k} for k in (0, 1)]
                + [{"x": np.zeros(2, np.float32)}]
            )

    with pytest.raises(ConfigError, match="batch 2 of Partial differs in the shape"):
        check_batch_at(Partial())
    with pytest.raises(ConfigError, match="Sequential lacks begin_epoch and batch_at"):
        check_batch_at(Sequential())


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
        sum(_drain(batch_stream(NoPrefetch(source), ("x",)), field="x"), [])
        for _ in range(2)
    ]
    assert source.iters == 2
    assert passes[0] != passes[1]  # each pass its own permutation
    assert [sorted(rows) for rows in passes] == [list(range(12))] * 2


def test_a_source_that_resets_and_returns_its_one_iterator_is_accepted():
    """A source may hand out one iterator object it restarts on each __iter__ (a
    torch DataLoader with persistent workers does): restartable, so accepted. A
    shared iterator that does NOT restart runs short, which the loop refuses after
    the epoch (tests/loop/test_train.py)."""

    class Resetting(Sequential):
        def __init__(self):
            super().__init__()
            self.iterator = None

        def __iter__(self):
            self.iterator = Sequential.__iter__(self)  # a fresh pass, one object
            return self.iterator

    assert check_split("train", NoPrefetch(Resetting())) == 5


# --- release ----------------------------------------------------------------------


def test_release_splits_releases_each_source_once_and_warns_on_failure():
    calls = []

    class Held(Sequential):
        def __init__(self, name, fail=False):
            super().__init__()
            self.name, self.fail = name, fail

        def release(self):
            calls.append(self.name)
            if self.fail:
                raise OSError("server gone")

    shared = Held("shared")
    data = auto_prefetch(
        {"train": Held("a", fail=True), "val": shared, "test": NoPrefetch(shared)}
    )
    with pytest.warns(NitroWarning, match=r"release\(\) of split `train` \(Held\) "):
        release_splits(data)
    assert calls == ["a", "shared"]
    with pytest.warns(NitroWarning):
        release_splits(data)  # a second call reaches the sources again, harmlessly
    assert calls == ["a", "shared"] * 2
