"""Blocks staged ahead (`loop/ahead.py`): the next block built on a worker thread.

On an accelerator the calls loop builds the next block (stack and transfer) on a
worker thread while its calls run; forced here on the CPU, where it must train the
same steps bit for bit, stop where the loop thread would, raise the loop's errors
and leave no thread behind.
"""

import threading

import jax
import numpy as np
import pytest
from experiments import QuietLogger, StopsAtStep, Tiny, make_batches

import jaxnitro as nx
from jaxnitro.loop import feed
from jaxnitro.loop.ahead import Ahead


def workers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "jaxnitro-blocks"]


# ------------------------------------------------------------------ Ahead -------
def test_items_arrive_in_order_and_an_error_at_its_place():
    def items():
        yield 1
        yield 2
        raise ValueError("the third failed")

    seen = []
    with pytest.raises(ValueError, match="the third failed"), Ahead(items()) as ahead:
        for item in ahead:
            seen.append(item)
    assert seen == [1, 2]
    assert workers() == []


def test_closing_early_stops_the_worker_and_closes_the_generator():
    closed = threading.Event()

    def endless():
        try:
            n = 0
            while True:
                yield n
                n += 1
        finally:
            closed.set()

    ahead = Ahead(endless(), depth=2)
    assert [next(ahead) for _ in range(3)] == [0, 1, 2]
    ahead.close()
    ahead.close()  # a second close does nothing
    assert closed.is_set() and workers() == []
    with pytest.raises(StopIteration):
        next(ahead)


# ------------------------------------------------------- in the calls loop -----
@pytest.fixture
def staged_ahead(monkeypatch):
    """The accelerator's data path, the block worker included, on the CPU."""
    monkeypatch.setattr(feed, "stages_on_device", lambda: True)
    monkeypatch.setattr(feed, "stages_ahead", lambda: True)


class Workers(QuietLogger):
    """Notes at each train line whether a block worker is alive."""

    def __init__(self):
        self.alive = []

    def log_metrics(self, metrics, *, step, epoch, context, **kw):
        if context == "train":
            self.alive.append(bool(workers()))


def train(steps_per_call, **kw):
    nitro = nx.Nitro(
        Tiny(max_epochs=3, n_train=16 * 20),
        checkpointer=None,
        steps_per_call=steps_per_call,
        log_every_n_steps=5,
        **kw,
    )
    return nitro.train()


def same_weights(a, b):
    for x, y in zip(
        jax.tree.leaves(a.train_state.weights),
        jax.tree.leaves(b.train_state.weights),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("steps_per_call", [1, 4])
def test_staged_ahead_trains_the_same_steps_bit_for_bit(
    monkeypatch, staged_ahead, steps_per_call
):
    watcher = Workers()
    ahead = train(steps_per_call, logger=watcher)
    assert any(watcher.alive)  # a worker built the blocks (it ends with them)
    assert workers() == []  # and was stopped when each epoch ended
    monkeypatch.setattr(feed, "stages_ahead", lambda: False)
    watcher = Workers()
    inline = train(steps_per_call, logger=watcher)
    assert not any(watcher.alive)
    same_weights(ahead, inline)
    assert [r["train_loss"] for r in ahead.history] == [
        r["train_loss"] for r in inline.history
    ]


def test_a_stop_lands_on_the_same_step_with_blocks_staged_ahead(
    monkeypatch, staged_ahead
):
    def stopped():
        logger = StopsAtStep(3)
        nitro = nx.Nitro(
            Tiny(max_epochs=2, n_train=16 * 20),
            logger=logger,
            checkpointer=None,
            steps_per_call=2,
            log_every_n_steps=1,
        )
        logger.nitro = nitro
        nitro.train()
        return nitro

    ahead = stopped()
    assert ahead.stop_reason == "requested" and workers() == []
    monkeypatch.setattr(feed, "stages_ahead", lambda: False)
    inline = stopped()
    assert ahead.current_step == inline.current_step
    same_weights(ahead, inline)


def test_a_batch_the_worker_refuses_is_raised_by_the_loop(staged_ahead):
    batches = make_batches(16 * 12, 16)
    batches[9] = {**batches[9], "x": batches[9]["x"][:, :4]}
    nitro = nx.Nitro(
        Tiny(max_epochs=1),
        data={"train": batches},
        logger=None,
        checkpointer=None,
        steps_per_call=2,
    )
    with pytest.raises(nx.ConfigError, match="Batch 9 of split `train`"):
        nitro.train()
    assert nitro.current_step == 8  # the first block of 8 trained, then the refusal
    assert workers() == []
