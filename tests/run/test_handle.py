"""The handle's verbs on what it holds: its data sources, released when training
ends and refused afterwards.
"""

import threading
import time

import pytest
from experiments import StopsAtStep, Tiny, make_batches
from handle_parts import parts_of
from toy_sources import FannedOut, surviving_threads

import jaxnitro as nx


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
            if parts_of(self.nitro).stops.stop_requested:
                stopping.set()

    nitro = nx.Nitro(
        Tiny(max_epochs=1),
        data={
            "train": nx.data.PrefetchIterator(Held(make_batches(128, 16)), workers=3)
        },
        logger=Stopper(1),
        checkpointer=None,
        log_every_n_steps=1,
    )
    nitro.logger.nitro = nitro
    nitro.train()
    assert nitro.stop_reason == "requested"
    assert surviving_threads() == []  # the workers' reads have all ended
    assert events[-1] == ("release",)  # and every one came before the release
    assert ("read", 2) in events
