"""The bounded channel between the prefetch threads."""

import threading
import time

from toy_sources import WAIT

from jaxnitro.data.channel import Channel


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
