"""One epoch's hot loop over the data: the same run at any worker count and on either
path, the data wait, staged device memory, plans against accum, early exits."""

import json
import threading

import grain
import jax
import numpy as np
import pytest
from experiments import QuietLogger, Tiny, TinyMetrics, make_batches, samples
from handle_parts import parts_of
from toy_sources import FannedOut, prefetch_threads, surviving_threads

import jaxnitro as nx
import jaxnitro.loop.assembly as assembly
import jaxnitro.loop.blocks as blocks
import jaxnitro.loop.feed as feed


class Shuffled(Tiny):
    """Tiny on a shuffled Grain dataset: the fan-out path."""

    workers: int = 2

    def build_data(self, dist):
        train = grain.MapDataset.source(samples(64)).shuffle(seed=3).batch(16)
        val = grain.MapDataset.source(samples(24, seed=1)).batch(16)
        return {
            "train": nx.data.PrefetchIterator(train, workers=self.workers),
            "val": val,
        }


def leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


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
    assert surviving_threads() == []


def test_the_fanout_path_and_the_inline_path_train_the_same(tmp_path):
    fanned = nx.Nitro(Shuffled(max_epochs=2), logger=None, checkpointer=None)
    fanned.train()

    class Inline(Shuffled):
        def build_data(self, dist):
            data = Shuffled.build_data(self, dist)
            return {
                "train": nx.data.NoPrefetch(data["train"].source),
                "val": data["val"],
            }

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


@pytest.mark.parametrize("staged", [1, 2])
def test_device_memory_holds_a_bounded_number_of_batches(monkeypatch, staged):
    """On an accelerator the prefetch stages routed fields on the device ahead of the
    step; forced here on the CPU, so the staged buffers are real device arrays."""
    monkeypatch.setattr(feed, "stages_on_device", lambda: True)
    x_shape = (16, 8)  # only a batch's `x` has it (width 20 keeps w1 at (8, 20))
    alive = {"train": [], "val": []}

    def count():  # batches' worth of `x` on the device (a block of k counts k)
        return sum(
            1 if a.shape == x_shape else a.shape[0] if a.shape[1:] == x_shape else 0
            for a in jax.live_arrays()
        )

    class Sampler(QuietLogger):
        def log_metrics(self, metrics, *, step, epoch, context, **kw):
            if context == "train":
                alive["train"].append(count())

    class Staged(TinyMetrics):
        def build_data(self, dist):
            return {
                name: nx.data.PrefetchIterator(
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
        Staged(max_epochs=2, width=20),
        logger=Sampler(),
        checkpointer=None,
        log_every_n_steps=1,
    )
    before = count()
    nitro.train()
    assert len(alive["train"]) == 16 and len(alive["val"]) == 12
    # Evaluation holds its staged batches and two more; training holds the block of
    # steps its calls read (the epoch's 8 batches here) and the one being placed.
    bounds = {"train": 2 * blocks.BLOCK_STEPS, "val": staged + 2}
    for phase, counts in alive.items():
        assert 1 <= max(counts) - before <= bounds[phase], (phase, counts)
    assert count() == before  # every staged batch freed when its pass closed


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
        lambda s: nx.data.PrefetchIterator(s, workers=2),
        lambda s: nx.data.PrefetchIterator(s, workers=1),
        nx.data.NoPrefetch,
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
        data={"train": nx.data.NoPrefetch(Short([4]))},
        accum=2,
        logger=None,
        checkpointer=None,
    )
    with pytest.raises(nx.ConfigError, match="delivered 3 batches in epoch 1"):
        nitro.train()
    assert nitro.current_step == 1
    assert not any(a.any() for a in accumulated(nitro))


class Stalling(FannedOut):
    """Batches from index `stall_from` on wait for `release` (a slow fetch)."""

    def __init__(self, batches, release, stall_from=2):
        super().__init__(batches)
        self.release = release
        self.stall_from = stall_from

    def batch_at(self, i):
        if i >= self.stall_from:
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

    # Training may read a block of 8 batches before its first call (staged as on
    # an accelerator): the stall starts after it, where the workers read ahead.
    stall_from = 8 if phase == "train" and feed.stages_on_device() else 2
    stalled = nx.data.PrefetchIterator(
        Stalling(make_batches(256, 16), release, stall_from), workers=3
    )
    if phase == "train":
        nitro = nx.Nitro(
            Tiny(max_epochs=1),
            data={"train": stalled},
            logger=Stopper(),
            checkpointer=None,
            run_ref=holder,
            log_every_n_steps=1,
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
    assert surviving_threads() == []


def _train_on(batches, **kw):
    nitro = nx.Nitro(
        Tiny(), data={"train": batches}, logger=None, checkpointer=None, **kw
    )
    return nitro


@pytest.mark.parametrize(
    "change, what, received",
    [
        (lambda x: x.astype(np.int32), "dtype", "int32[16, 8]"),
        (lambda x: x[:, :4], "shape", "float32[16, 4]"),
    ],
)
@pytest.mark.parametrize("accum", [1, 2])
def test_a_batch_changing_shape_or_dtype_mid_epoch_is_named_and_trains_nothing(
    change, what, received, accum
):
    batches = make_batches(64, 16)
    batches[2] = {**batches[2], "x": change(batches[2]["x"])}
    nitro = _train_on(batches, accum=accum)
    with pytest.raises(nx.ConfigError) as caught:
        nitro.train()
    assert str(caught.value).startswith(
        f"Batch 2 of split `train` (epoch 1) changes the {what} of field `x`: "
        f"expected float32[16, 8] as in the first batch, received {received}."
    )
    # The refused batch ran nothing: small batches are stacked into blocks on
    # every backend, and the block of the epoch's first 8 steps is refused before
    # any of its steps runs.
    assert nitro.current_step == 0


def test_a_divergence_on_non_finite_inputs_says_the_data_is_at_fault():
    batches = make_batches(64, 16)
    batches[1]["x"][3, 2] = np.nan
    batches[1]["x"][5, 0] = np.inf
    with pytest.raises(nx.DivergenceError) as caught:
        _train_on(batches).train()
    assert str(caught.value).startswith(
        "The training loss is nan at step 2 of epoch 1 (batch 1 of the epoch). The "
        "batch's inputs were already non-finite (`x` holds 1 NaN and 1 inf of 128 "
        "values): the data, not the optimization, is at fault."
    )


class Overflowing(Tiny):
    def learning_rate(self, group=None):
        return 1e30


def test_a_divergence_on_finite_inputs_says_the_model_diverged():
    nitro = nx.Nitro(
        Overflowing(),
        data={"train": make_batches(64, 16)},
        logger=None,
        checkpointer=None,
    )
    with pytest.raises(nx.DivergenceError) as caught:
        nitro.train()
    message = str(caught.value)
    assert "The batch's inputs were all finite, so the model diverged." in message
    assert "with a lower learning rate" in message


class _AsksToStopAtBatch1(list):
    """Train batches that call `request_stop` on `nitro` as they yield batch 1."""

    nitro = None

    def __iter__(self):
        for index, batch in enumerate(list.__iter__(self)):
            if index == 1 and self.nitro is not None:
                self.nitro.request_stop()
            yield batch


@pytest.mark.parametrize("agreed, stopped_at", [(False, 2), (True, 5)])
def test_with_an_agreement_the_loop_stops_at_its_point_not_at_the_request(
    monkeypatch, agreed, stopped_at
):
    """Across processes the step loop reads the agreed stop: a request made before
    step 2 ends the epoch at the next agreement point (steps 1, 5, ... here), where
    every rank votes, and not at the next step, as it does in one process."""
    from jaxnitro.devices import agreement
    from jaxnitro.loop.steps import run_epoch
    from jaxnitro.run.restore import starting_state
    from jaxnitro.run.training import epoch_context

    monkeypatch.setattr(agreement, "AGREE_MOST_STEPS", 4)
    monkeypatch.setattr(agreement, "AGREE_SECONDS", 1e9)  # every 4 steps
    # The request comes as the loop reads batch 1: the inline feed and blocks of
    # one batch pin that moment (staging threads, or a block of 8 read before its
    # first step, read ahead, so the request would come sooner).
    monkeypatch.setattr(feed, "stages_on_device", lambda: False)
    monkeypatch.setattr(assembly, "CPU_DIRECT_BATCH_BYTES", 0)
    data = _AsksToStopAtBatch1(make_batches(128, 16))
    nitro = nx.Nitro(Tiny(), data={"train": data}, logger=None, checkpointer=None)
    data.nitro = nitro
    parts = parts_of(nitro)
    plan = parts.prepared.plan
    parts.values.commit(starting_state(parts.values, plan, manual=False, accum=1))
    agreed_stop = agreement.StopAgreement(nitro.current_step) if agreed else None
    log = run_epoch(epoch_context(parts_of(nitro)), 1, agreement=agreed_stop)
    assert (nitro.current_step, log.trained) == (stopped_at, stopped_at)
    if agreed_stop is not None:
        assert (agreed_stop.stop_requested, agreed_stop.preempted) == (True, False)
        assert agreed_stop.next_at == 9
