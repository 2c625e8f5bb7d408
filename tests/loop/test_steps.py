"""The data pipeline as the training loop uses it: paths, order, waits, release."""

import json
import threading
import time

import grain
import jax
import numpy as np
import pytest
from experiments import QuietLogger, StopsAtStep, Tiny, TinyMetrics, make_batches

import jaxnitro as nx
import jaxnitro.loop.feed as feed


def samples(n, seed=0):
    batch = make_batches(n, n, seed=seed)[0]
    return [{"x": x, "y": y} for x, y in zip(batch["x"], batch["y"], strict=True)]


class Shuffled(Tiny):
    """Tiny on a shuffled Grain dataset: the fan-out path."""

    workers: int = 2

    def build_data(self, dist):
        train = grain.MapDataset.source(samples(64)).shuffle(seed=3).batch(16)
        val = grain.MapDataset.source(samples(24, seed=1)).batch(16)
        return {
            "train": nx.PrefetchIterator(train, workers=self.workers),
            "val": val,
        }


def leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def prefetch_threads():
    return [t for t in threading.enumerate() if "prefetch" in t.name]


def prefetch_threads_exit(timeout=10.0):
    """The prefetch threads still alive after `timeout` seconds to exit: a closed
    stream joins only its device-memory holder, and the workers leave on their own."""
    deadline = time.monotonic() + timeout
    while prefetch_threads() and time.monotonic() < deadline:
        time.sleep(0.001)
    return prefetch_threads()


def test_ordered_fanout_reproduces_a_run_bitwise_at_any_worker_count():
    runs = {}
    for workers in (1, 2, 4):
        nitro = nx.Nitro(
            Shuffled(max_epochs=2, workers=workers), logger=None, checkpointer=None
        )
        assert nitro.prepared.prefetch["train"].workers == workers
        nitro.train()
        runs[workers] = leaves(nitro.parameters)
    for workers in (2, 4):
        for a, b in zip(runs[1], runs[workers], strict=True):
            np.testing.assert_array_equal(a, b)
    assert prefetch_threads_exit() == []


def test_the_fanout_path_and_the_inline_path_train_the_same(tmp_path):
    fanned = nx.Nitro(Shuffled(max_epochs=2), logger=None, checkpointer=None)
    fanned.train()

    class Inline(Shuffled):
        def build_data(self, dist):
            data = Shuffled.build_data(self, dist)
            return {"train": nx.NoPrefetch(data["train"].source), "val": data["val"]}

    inline = nx.Nitro(Inline(max_epochs=2), logger=None, checkpointer=None)
    assert inline.prepared.prefetch["train"].path == "inline"
    inline.train()
    for a, b in zip(leaves(fanned.parameters), leaves(inline.parameters), strict=True):
        np.testing.assert_array_equal(a, b)


def test_data_wait_frac_is_logged_once_per_epoch(tmp_path):
    nx.Nitro(Shuffled(max_epochs=2), run_dir=str(tmp_path), checkpointer=None).train()
    lines = [
        json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()
    ]
    data = [x for x in lines if x.get("context") == "data"]
    assert [x["epoch"] for x in data] == [1, 2]
    assert all(0 <= x["data_wait_frac"] <= 1 for x in data)


def test_a_list_of_batches_takes_the_materialized_path_and_never_warns():
    nitro = nx.Nitro(Tiny(), logger=None, checkpointer=None)
    assert {name: cfg.path for name, cfg in nitro.prepared.prefetch.items()} == {
        "train": "materialized",
        "val": "materialized",
        "test": "materialized",
    }
    assert "prefetch_path materialized" in nitro.binding_report()


class Releasing(Tiny):
    def build_data(self, dist):
        data = Tiny.build_data(self, dist)
        self.released.clear()
        return {
            name: Tracked(batches, name, self.released)
            for name, batches in data.items()
        }

    released: list = None  # type: ignore[assignment]


class Tracked(list):
    def __init__(self, batches, name, released):
        super().__init__(batches)
        self.name, self.released = name, released

    def release(self):
        self.released.append(self.name)
        if self.name == "val":
            raise OSError("the val server is gone")


def test_release_runs_once_per_handle_at_the_end_of_training():
    released = []
    nitro = nx.Nitro(
        Releasing(max_epochs=1, released=released), logger=None, checkpointer=None
    )
    with pytest.warns(nx.NitroWarning, match="val"):
        nitro.train()
    assert sorted(released) == ["test", "train", "val"]  # val's error did not stop them
    nitro.release()  # a second release is harmless
    assert sorted(released) == ["test", "train", "val"]


def test_release_for_a_handle_that_only_evaluates():
    released = []
    nitro = nx.Nitro(Releasing(released=released), logger=None, checkpointer=None)
    nitro.evaluate(split="test")
    assert released == []
    with pytest.warns(nx.NitroWarning, match="val"):
        nitro.release()
    assert sorted(released) == ["test", "train", "val"]


class Closing(list):
    """Built batches behind a source whose release() closes it."""

    def release(self):
        self.closed = True


class OnClosing(Tiny):
    def build_data(self, dist):
        data = Tiny.build_data(self, dist)
        return {
            "train": Closing(data["train"]),
            "val": Closing(data["val"]),
            "test": data["test"],
        }


def test_a_released_split_is_refused_naming_what_released_it():
    nitro = nx.Nitro(OnClosing(max_epochs=1), logger=None, checkpointer=None)
    nitro.train()
    ended = (
        r"was released by the end of train\(\) \(phase Done\), which ran its "
        r"source's release\(\).*Nitro\(e, weights=nitro\)"
    )
    with pytest.raises(
        nx.ConfigError, match=r"validate\(\): split `val` \(Closing\) " + ended
    ):
        nitro.validate()
    with pytest.raises(
        nx.ConfigError, match=r"train\(\): split `train` \(Closing\) " + ended
    ):
        nitro.train()
    assert "loss" in nitro.evaluate(split="test")  # a list holds nothing open

    only_evaluated = nx.Nitro(OnClosing(), logger=None, checkpointer=None)
    only_evaluated.release()
    by_hand = r"split `val` \(Closing\) was released by nitro\.release\(\)"
    with pytest.raises(nx.ConfigError, match=r"evaluate\(split='val'\): " + by_hand):
        only_evaluated.evaluate(split="val")
    with pytest.raises(nx.ConfigError, match=r"render\(split='val'\): " + by_hand):
        only_evaluated.render()


def test_the_binding_report_says_what_drop_last_discards():
    class Dropping(Tiny):
        def build_data(self, dist):
            train = grain.MapDataset.source(samples(70)).batch(16, drop_remainder=True)
            return {"train": train}

    report = nx.Nitro(Dropping(), logger=None, checkpointer=None).binding_report()
    assert "train drop-last discards 6 samples an epoch" in report
    listed = nx.Nitro(Tiny(), logger=None, checkpointer=None).binding_report()
    assert "train drop-last discards 0 samples an epoch" in listed


class FannedOut:
    """Built batches behind the fan-out trait: workers fetch them by index."""

    def __init__(self, batches):
        self.batches = batches

    def __len__(self):
        return len(self.batches)

    def begin_epoch(self):
        return None

    def batch_at(self, i):
        return self.batches[i]

    def __iter__(self):
        return iter(self.batches)


def test_evaluation_pads_on_the_prefetch_thread_and_hooks_see_unpadded_batches(
    monkeypatch,
):
    import jaxnitro.data.prefetch as prefetch

    padded_on = []
    pad = prefetch.pad_batch

    def spying_pad(batch, size):
        padded_on.append((threading.current_thread().name, len(batch["x"]), size))
        return pad(batch, size)

    monkeypatch.setattr(prefetch, "pad_batch", spying_pad)
    sizes = []

    class Counting(TinyMetrics):
        def metrics(self, logits, *, y):
            sizes.append((len(logits), len(y)))
            return TinyMetrics.metrics(self, logits, y=y)

    class Fanned(Counting):
        def build_data(self, dist):  # val: batches of 16, 16 and a short 8
            val = make_batches(40, 16, seed=1)
            return {
                "train": make_batches(64, 16),
                "val": nx.PrefetchIterator(FannedOut(val), workers=2),
            }

    class Listed(Counting):
        def build_data(self, dist):
            return {"train": make_batches(64, 16), "val": make_batches(40, 16, seed=1)}

    fanned = nx.Nitro(Fanned(), logger=None, checkpointer=None)
    assert fanned.prepared.prefetch["val"].path == "fanout"
    streamed = fanned.validate()
    assert sizes == [(16, 16), (16, 16), (8, 8)]
    # On the CPU the workers pad (nothing to stage); on an accelerator, the transfer
    # thread: either way a prefetch thread, never the consumer.
    assert all(name.startswith("jaxnitro-prefetch-val-") for name, *_ in padded_on)
    assert [(n, size) for _, n, size in padded_on] == [(16, 16), (16, 16), (8, 16)]
    padded_on.clear()
    sizes.clear()
    inline = nx.Nitro(Listed(), logger=None, checkpointer=None).validate()
    assert sizes == [(16, 16), (16, 16), (8, 8)]
    # A list is read inline on the CPU; staged, its one producer thread pads.
    padder = (
        "jaxnitro-prefetch-val-producer" if feed.stages_on_device() else "MainThread"
    )
    assert [name for name, *_ in padded_on] == [padder] * 3
    assert streamed["acc"] == inline["acc"]
    np.testing.assert_array_equal(streamed["confusion"], inline["confusion"])
    assert streamed["confusion"].sum() == 40


@pytest.mark.parametrize("staged", [1, 2])
def test_device_memory_holds_at_most_device_batches_plus_two_batches(
    monkeypatch, staged
):
    """On an accelerator the prefetch stages routed fields on the device ahead of the
    step; forced here on the CPU, so the staged buffers are real device arrays."""
    monkeypatch.setattr(feed, "stages_on_device", lambda: True)
    x_shape = (16, 8)  # only a batch's `x` has it (width 20 keeps w1 at (8, 20))
    alive = {"train": [], "val": []}

    def count():
        return sum(a.shape == x_shape for a in jax.live_arrays())

    class Sampler(QuietLogger):
        def log_metrics(self, metrics, *, step, epoch, context, **kw):
            if context == "train":
                alive["train"].append(count())

    class Staged(TinyMetrics):
        def build_data(self, dist):
            return {
                name: nx.PrefetchIterator(
                    FannedOut(make_batches(n, 16, seed=seed)),
                    workers=2,
                    device_batches=staged,
                )
                for name, n, seed in (("train", 128, 0), ("val", 96, 1))
            }

        def metrics(self, logits, *, y):
            alive["val"].append(count())
            return TinyMetrics.metrics(self, logits, y=y)

    nitro = nx.Nitro(
        Staged(max_epochs=2, width=20), logger=Sampler(), checkpointer=None
    )
    before = count()
    nitro.train()
    assert len(alive["train"]) == 16 and len(alive["val"]) == 12
    for phase, counts in alive.items():
        assert 1 <= max(counts) - before <= staged + 2, (phase, counts)
    assert count() == before  # every staged batch freed when its pass closed


@pytest.mark.parametrize("split", ["train", "val"])
def test_a_grain_filter_is_refused_even_where_it_drops_the_probed_batch(split):
    batched = grain.MapDataset.source(samples(64)).batch(16)
    first = batched[0]["x"]
    holed = batched.filter(lambda b: not np.array_equal(b["x"], first))
    with pytest.raises(
        nx.ConfigError, match=f"Split `{split}` is a grain.MapDataset with `.filter"
    ):
        nx.Nitro(
            Tiny(),
            data={"train": batched, split: holed},
            logger=None,
            checkpointer=None,
        )


@pytest.mark.parametrize("split", ["train", "val"])
def test_an_unbatched_split_is_refused_at_setup(split):
    batched = grain.MapDataset.source(samples(64)).batch(16)
    single = grain.MapDataset.source(samples(64))  # per-sample x (8,) and y (3,)
    with pytest.raises(
        nx.ConfigError, match="x: 8, y: 3.*a source of single samples must be batched"
    ):
        nx.Nitro(
            Tiny(),
            data={"train": batched, split: single},
            logger=None,
            checkpointer=None,
        )


class CountsPlans:
    """The whole trait, counting its plans; `__iter__` plans through begin_epoch."""

    def __init__(self):
        batch = make_batches(64, 64)[0]
        self.x, self.y = batch["x"], batch["y"]
        self.epoch_token = 0

    def __len__(self):
        return 4

    def begin_epoch(self):
        self.epoch_token += 1
        return np.random.default_rng(self.epoch_token).permutation(64)

    def batch_at(self, i, plan=None):
        rows = plan[i * 16 : (i + 1) * 16]
        return {"x": self.x[rows], "y": self.y[rows]}

    def __iter__(self):
        plan = self.begin_epoch()
        return (self.batch_at(i, plan) for i in range(len(self)))


@pytest.mark.parametrize(
    "wrap",
    [lambda s: s, lambda s: nx.PrefetchIterator(s, workers=1), nx.NoPrefetch],
    ids=["fanout", "single", "inline"],
)
def test_setup_draws_one_plan_so_n_epochs_see_n_plus_one(wrap):
    source = CountsPlans()
    nitro = nx.Nitro(
        Tiny(max_epochs=2), data={"train": wrap(source)}, logger=None, checkpointer=None
    )
    assert source.epoch_token == 1  # the probe's one plan, drawn by its __iter__
    nitro.train()
    assert source.epoch_token == 3


class PlansInIter:
    """`batch_at` alone, its plan drawn in `__iter__`: nothing before it exists."""

    def __init__(self):
        batch = make_batches(64, 64)[0]
        self.x, self.y = batch["x"], batch["y"]
        self.rng = np.random.default_rng(0)
        self.plans = 0
        self.reads: list[int] = []  # the plan each batch_at read

    def __len__(self):
        return 4

    def batch_at(self, i):
        self.reads.append(self.plans)
        rows = self.perm[i * 16 : (i + 1) * 16]
        return {"x": self.x[rows], "y": self.y[rows]}

    def __iter__(self):
        self.perm = self.rng.permutation(64)
        self.plans += 1
        return (self.batch_at(i) for i in range(len(self)))


@pytest.mark.parametrize("inline", [False, True], ids=["single", "inline"])
def test_a_source_with_batch_at_alone_is_iterated_at_setup_and_every_epoch(inline):
    source = PlansInIter()
    split = nx.NoPrefetch(source) if inline else source
    if inline:
        nitro = nx.Nitro(
            Tiny(max_epochs=2), data={"train": split}, logger=None, checkpointer=None
        )
    else:
        with pytest.warns(nx.NitroWarning, match="runs in ONE producer thread"):
            nitro = nx.Nitro(
                Tiny(max_epochs=2),
                data={"train": split},
                logger=None,
                checkpointer=None,
            )
    nitro.train()
    last = source.plans
    assert source.reads[-8:] == [last - 1] * 4 + [last] * 4  # a new plan each epoch


def test_a_source_with_batch_at_and_no_iter_is_read_by_index_on_one_producer():
    class ByIndex:
        def __init__(self):
            self.batches = make_batches(64, 16)

        def __len__(self):
            return len(self.batches)

        def batch_at(self, i):
            return self.batches[i]

    with pytest.warns(nx.NitroWarning, match="runs in ONE producer thread"):
        nitro = nx.Nitro(
            Tiny(max_epochs=1),
            data={"train": ByIndex()},
            logger=None,
            checkpointer=None,
        )
    assert nitro.prepared.prefetch["train"].path == "single_no_trait"
    nitro.train()
    assert nitro.current_step == 4


class CountsCalls(CountsPlans):
    """`CountsPlans` counting its `__iter__` calls; each calls `begin_epoch` once."""

    def __init__(self):
        super().__init__()
        self.iters = 0

    def __iter__(self):
        self.iters += 1
        return super().__iter__()


@pytest.mark.parametrize(
    ("wrap", "iters"),
    [
        (lambda s: nx.PrefetchIterator(s, workers=2), 1),
        (lambda s: nx.PrefetchIterator(s, workers=1), 3),
        (nx.NoPrefetch, 3),
    ],
    ids=["fanout", "single", "inline"],
)
def test_only_the_fanout_calls_begin_epoch_and_the_other_paths_iterate(wrap, iters):
    """The spec: the fan-out never iterates and the other paths never call
    begin_epoch; setup's probe goes through iteration."""
    source = CountsCalls()
    nitro = nx.Nitro(
        Tiny(max_epochs=2), data={"train": wrap(source)}, logger=None, checkpointer=None
    )
    assert (source.iters, source.epoch_token) == (1, 1)  # the probe iterated
    nitro.train()
    assert source.iters == iters  # the fan-out's 2 plans came from begin_epoch
    assert source.epoch_token == 3


class Replanned:
    """The whole trait, the batch count set by each plan: `counts[k]` for the k-th
    plan (the probe's is the first)."""

    def __init__(self, counts):
        self.batches = make_batches(16 * max(counts), 16)
        self.counts = counts
        self.count = counts[0]
        self.epoch_token = 0

    def __len__(self):
        return self.count

    def begin_epoch(self):
        self.count = self.counts[min(self.epoch_token, len(self.counts) - 1)]
        self.epoch_token += 1

    def batch_at(self, i):
        return self.batches[i]

    def __iter__(self):
        self.begin_epoch()
        return (self.batch_at(i) for i in range(len(self)))


def accumulated(nitro):
    return [np.asarray(x) for x in jax.tree.leaves(nitro.train_state.accumulator)]


@pytest.mark.parametrize(
    "wrap",
    [
        lambda s: nx.PrefetchIterator(s, workers=2),
        lambda s: nx.PrefetchIterator(s, workers=1),
        nx.NoPrefetch,
    ],
    ids=["fanout", "single", "inline"],
)
def test_an_epoch_whose_plan_breaks_accum_is_refused_before_it_trains(wrap):
    source = Replanned([4, 4, 5])  # the probe, epoch 1, epoch 2
    nitro = nx.Nitro(
        Tiny(max_epochs=2),
        data={"train": wrap(source)},
        accum=2,
        logger=None,
        checkpointer=None,
    )
    with pytest.raises(
        nx.ConfigError,
        match=r"The train split has 5 batches in epoch 2 \(len\(\) read after the "
        r"epoch's plan was drawn\), which does not divide by accum=2 \(5 % 2 = 1\).*"
        r"Keep each epoch's batch count a multiple of accum",
    ):
        nitro.train()
    assert nitro.current_step == 2  # epoch 1's steps; epoch 2 trained nothing
    assert not any(a.any() for a in accumulated(nitro))


def test_an_epoch_that_runs_short_mid_step_leaves_no_gradient_behind():
    class Short(Replanned):
        def __iter__(self):  # says 4 batches, yields 3: the last step is unfinished
            return (self.batch_at(i) for i in range(3))

    nitro = nx.Nitro(
        Tiny(max_epochs=1),
        data={"train": nx.NoPrefetch(Short([4]))},
        accum=2,
        logger=None,
        checkpointer=None,
    )
    with pytest.raises(nx.ConfigError, match="delivered 3 batches in epoch 1"):
        nitro.train()
    assert nitro.current_step == 1
    assert not any(a.any() for a in accumulated(nitro))


class Stalling(FannedOut):
    """Batches from index 2 on wait for `release` (a slow fetch)."""

    def __init__(self, batches, release):
        super().__init__(batches)
        self.release = release

    def batch_at(self, i):
        if i >= 2:
            self.release.wait(10.0)
        return super().batch_at(i)


@pytest.mark.parametrize("phase", ["train", "validate"])
def test_an_early_exit_does_not_wait_for_workers_inside_a_slow_batch_at(phase):
    """A stop request (training) or an error (evaluation) closes the stream without
    joining the workers, which exit on their own once their batch is built."""
    release = threading.Event()
    holder = []

    class Stopper(QuietLogger):
        def log_metrics(self, metrics, *, step, epoch, context, **kw):
            if context == "train" and step == 1:
                holder[0].request_stop()

    class Failing(TinyMetrics):
        def metrics(self, logits, *, y):
            raise ValueError("the metric failed")

    stalled = nx.PrefetchIterator(Stalling(make_batches(128, 16), release), workers=3)
    if phase == "train":
        nitro = nx.Nitro(
            Tiny(max_epochs=1),
            data={"train": stalled},
            logger=Stopper(),
            checkpointer=None,
            run_ref=holder,
        )
        nitro.train()
        assert nitro.stop_reason == "requested"
    else:
        data = {"train": make_batches(64, 16), "val": stalled}
        nitro = nx.Nitro(Failing(), data=data, logger=None, checkpointer=None)
        with pytest.raises(ValueError, match="the metric failed"):
            nitro.validate()
    assert prefetch_threads()  # returned while the workers wait inside batch_at
    release.set()
    assert prefetch_threads_exit() == []


def test_a_source_is_released_only_after_the_workers_reading_it_finish():
    """A stream closes without waiting for its workers; the source's release() (a
    file or a client closed) waits for them, so no batch_at runs on a released
    source."""
    events = []
    stopping = threading.Event()

    class Held(FannedOut):
        def batch_at(self, i):
            if i >= 2:  # a slow fetch, under way when training stops
                stopping.wait(10.0)
                time.sleep(0.3)
            events.append(("read", i))
            return super().batch_at(i)

        def release(self):
            events.append(("release",))

    class Stopper(StopsAtStep):
        def log_metrics(self, metrics, *, step, **kw):
            super().log_metrics(metrics, step=step, **kw)
            if self.nitro.status.stop_requested:
                stopping.set()

    nitro = nx.Nitro(
        Tiny(max_epochs=1),
        data={"train": nx.PrefetchIterator(Held(make_batches(128, 16)), workers=3)},
        logger=Stopper(1),
        checkpointer=None,
    )
    nitro.logger.nitro = nitro
    nitro.train()
    assert nitro.stop_reason == "requested"
    assert prefetch_threads_exit() == []  # the workers' reads have all ended
    assert events[-1] == ("release",)  # and every one came before the release
    assert ("read", 2) in events


def test_a_sources_own_check_source_options_runs_at_setup_for_every_split():
    calls = []

    class Checked(list):
        def check_source_options(self, name, cfg):
            calls.append((name, cfg.path))

    class Buffered(list):
        def check_source_options(self, name, cfg):
            raise nx.ConfigError(f"split `{name}`: buffer=True reuses one array")

    data = Tiny().build_data(None)
    split = {
        "train": Checked(data["train"]),
        "val": nx.NoPrefetch(Checked(data["val"])),
    }
    nx.Nitro(Tiny(), data=split, logger=None, checkpointer=None)
    assert calls == [("train", "materialized"), ("val", "inline")]
    with pytest.raises(nx.ConfigError, match="split `train`: buffer=True reuses"):
        nx.Nitro(
            Tiny(),
            data={"train": Buffered(data["train"])},
            logger=None,
            checkpointer=None,
        )
    nx.check_source_options(Checked(), "test", nx.prefetch_config(Checked()))
    assert calls[-1] == ("test", "materialized")


def test_the_data_api_the_spec_lists_is_public():
    from jaxnitro.data import prefetch, protocol, sources, stream

    assert nx.check_source_options is sources.check_source_options
    assert nx.epoch_token is protocol.epoch_token
    assert nx.PrefetchStream is stream.PrefetchStream
    assert nx.batch_stream is prefetch.batch_stream
    assert nx.eval_stream is prefetch.eval_stream
