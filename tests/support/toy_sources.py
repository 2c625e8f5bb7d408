"""Small batch sources for the data tests, and what a test reads of the prefetch
threads and the live device arrays.
"""

import threading
import time

import jax
import numpy as np

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


def prefetch_threads():
    return [t for t in threading.enumerate() if t.name.startswith("jaxnitro-prefetch")]


def surviving_threads(timeout=WAIT):
    """The prefetch threads still alive after `timeout` seconds to exit on their own:
    a closed stream joins only the thread holding device memory, and its workers
    leave after their current batch."""
    deadline = time.monotonic() + timeout
    while prefetch_threads() and time.monotonic() < deadline:
        time.sleep(0.001)
    return prefetch_threads()


def live_arrays():
    return len(jax.live_arrays())


def drain(stream, field="i"):
    seen = []
    for item in stream:
        seen.append(np.asarray(item.host[field]).tolist())
        stream.release(item.device)
    return seen


def named_prepare(host):
    """A prepare that stages nothing (the CPU loop's) and says which thread ran it."""
    return [(threading.current_thread().name, host)]


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
