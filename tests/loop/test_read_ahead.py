"""The next epoch's first block, staged while an epoch ends (loop/read_ahead.py).

On an accelerator (here: the CPU made to stage its batches, as `--staged` does), a
list of built batches has each epoch's first block read, stacked and placed by the
epoch before, once its last call is dispatched; the training is the same to the
bit, and where reading ahead would not be safe nothing is read ahead.
"""

import collections

import jax
import numpy as np
import pytest
from experiments import QuietLogger, Tiny, make_batches

import jaxnitro as nx
import jaxnitro.loop.feed as feed
import jaxnitro.loop.steps as steps
import jaxnitro.run.training as training
from jaxnitro.loop.read_ahead import ReadAhead


class Recorded(ReadAhead):
    """The train()'s holder, kept for the test to read."""

    made: list["Recorded"] = []

    def __init__(self):
        super().__init__()
        Recorded.made.append(self)


@pytest.fixture
def recorded(monkeypatch):
    Recorded.made = []
    monkeypatch.setattr(training, "ReadAhead", Recorded)
    return Recorded.made


@pytest.fixture
def staged(monkeypatch):
    monkeypatch.setattr(feed, "stages_on_device", lambda: True)


def reads(monkeypatch):
    """The epochs whose first block was read ahead, in order."""
    read = []
    real = steps.read_first_block

    def spy(epoch, source, pass_, assembler):
        read.append(epoch)
        return real(epoch, source, pass_, assembler)

    monkeypatch.setattr(steps, "read_first_block", spy)
    return read


def handle(tmp_path, name, **kw):
    """A Nitro on Tiny, three epochs of 10 batches, no checkpointer."""
    return nx.Nitro(
        Tiny(n_train=16 * 10, max_epochs=3),
        run_dir=str(tmp_path / name),
        checkpointer=None,
        **kw,
    )


def trained(tmp_path, name, **kw):
    nitro = handle(tmp_path, name, **kw)
    nitro.train()
    return nitro


def weights(nitro):
    return [np.asarray(leaf) for leaf in jax.tree.leaves(nitro.train_state.weights)]


@pytest.mark.parametrize(
    "kw",
    [
        {"steps_per_call": 1},
        {"steps_per_call": 4},
        {"steps_per_call": 2, "accum": 2},  # blocks of micro-batches
        pytest.param(
            {"steps_per_call": 4, "n_devs": 2}, marks=pytest.mark.needs_devices(2)
        ),  # blocks split over a mesh
    ],
    ids=["k1", "k4", "accum2", "mesh"],
)
def test_each_epoch_starts_from_the_block_the_one_before_read(
    tmp_path, monkeypatch, staged, recorded, kw
):
    read = reads(monkeypatch)
    ahead = trained(tmp_path, "ahead", **kw)
    assert read == [2, 3]  # the last epoch has none to read
    [holder] = recorded
    assert (holder.taken, holder.dropped) == (2, 0)
    # The same training without it, to the bit.
    monkeypatch.setattr(training, "ReadAhead", lambda: None)
    read.clear()
    plain = trained(tmp_path, "plain", **kw)
    assert read == []
    for x, y in zip(weights(ahead), weights(plain), strict=True):
        np.testing.assert_array_equal(x, y)
    assert [r["train_loss"] for r in ahead.history] == [
        r["train_loss"] for r in plain.history
    ]


def test_an_epoch_end_hook_turns_it_off(tmp_path, monkeypatch, staged, recorded):
    # A hook may change the data between epochs: each epoch reads its own.
    read = reads(monkeypatch)
    nitro = handle(tmp_path, "hooked", steps_per_call=4)
    nitro.on_epoch_end(lambda nitro, epoch, observations: None)
    nitro.train()
    assert (read, recorded) == ([], [])


def test_on_a_cpu_the_loop_reads_nothing_ahead(tmp_path, monkeypatch, recorded):
    # A CPU takes its host batches as they are: there is no copy to start early.
    monkeypatch.setattr(feed, "stages_on_device", lambda: False)  # even --staged
    read = reads(monkeypatch)
    trained(tmp_path, "cpu", steps_per_call=4)
    assert read == []
    assert (recorded[0].taken, recorded[0].dropped) == (0, 0)


def test_a_block_no_epoch_takes_is_dropped_at_the_end(
    tmp_path, monkeypatch, staged, recorded
):
    # The run stops after the first epoch (a stop asked for at its end): the
    # second epoch's block, read while the first ended, is closed with the train().
    read = reads(monkeypatch)
    nitro = handle(tmp_path, "stopped", steps_per_call=4)
    closed = []
    real_close = ReadAhead.close

    def close(self):
        closed.append(self._held is not None)
        real_close(self)

    monkeypatch.setattr(ReadAhead, "close", close)
    real_summary = training.EpochLog.log_summary

    def stop_at_the_end(self, step):
        real_summary(self, step)
        nitro.request_stop()

    monkeypatch.setattr(training.EpochLog, "log_summary", stop_at_the_end)
    nitro.train()
    assert nitro.current_epoch == 1
    assert read == [2]
    [holder] = recorded
    assert (holder.taken, holder.dropped) == (0, 1)
    assert closed[-1] and closed.count(True) == 1  # at the train()'s end, once


def test_auto_reads_ahead_once_it_has_chosen(tmp_path, monkeypatch, staged, recorded):
    # "auto" times its first epoch at one step a call and may then choose another
    # count: nothing is read ahead until the count is known.
    read = reads(monkeypatch)
    nitro = trained(tmp_path, "auto", steps_per_call="auto")
    chosen = nitro.status.auto_steps_per_call
    assert chosen is not None
    assert read == [3]
    assert (recorded[0].taken, recorded[0].dropped) == (1, 0)


def test_a_list_changed_after_the_block_was_read_is_read_again(
    tmp_path, monkeypatch, staged, recorded
):
    # Code outside a hook (here a logger) replaces the list's first batch between
    # epochs 1 and 2, after epoch 1 read epoch 2's first block: epoch 2 trains on
    # the new batch, as a run that read nothing ahead does.
    def run(name):
        train = make_batches(16 * 10, 16)

        class Shared(Tiny):
            def build_data(self, dist):
                return {**super().build_data(dist), "train": train}

        class Replaces(QuietLogger):
            def log_metrics(self, metrics, *, step, epoch, context, **kw):
                if context == "train_epoch" and epoch == 1:
                    train[0] = {"x": train[0]["x"] * 2, "y": train[0]["y"]}

        nitro = nx.Nitro(
            Shared(max_epochs=3),
            run_dir=str(tmp_path / name),
            checkpointer=None,
            logger=Replaces(),
            steps_per_call=4,
        )
        nitro.train()
        return nitro

    ahead = run("ahead")
    [holder] = recorded
    assert (holder.taken, holder.dropped) == (1, 1)  # epoch 2's dropped, 3's taken
    monkeypatch.setattr(training, "ReadAhead", lambda: None)
    plain = run("plain")
    for x, y in zip(weights(ahead), weights(plain), strict=True):
        np.testing.assert_array_equal(x, y)


def test_a_list_of_named_tuples_is_read_ahead_too(
    tmp_path, monkeypatch, staged, recorded
):
    # Each epoch makes a dict of a named tuple batch anew: the block read ahead is
    # recognised by its arrays.
    Batch = collections.namedtuple("Batch", "x y")

    class Tuples(Tiny):
        def build_data(self, dist):
            data = super().build_data(dist)
            return {**data, "train": [Batch(b["x"], b["y"]) for b in data["train"]]}

    nx.Nitro(
        Tuples(n_train=16 * 10, max_epochs=3),
        run_dir=str(tmp_path / "tuples"),
        checkpointer=None,
        steps_per_call=4,
    ).train()
    [holder] = recorded
    assert (holder.taken, holder.dropped) == (2, 0)
