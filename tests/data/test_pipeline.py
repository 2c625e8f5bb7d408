"""The fan-out's coordinator: credits, index order, who wakes whom, and close."""

import threading
import time

from toy_sources import WAIT

from jaxnitro.data.channel import ChannelClosed
from jaxnitro.data.pipeline import END, Coordinator


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
