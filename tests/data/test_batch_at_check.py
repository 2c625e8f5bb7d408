"""check_batch_at: a batch_at that takes sample offsets, ignores its plan, or builds
batches that differ from iteration's.
"""

import numpy as np
import pytest
from toy_sources import Indexed, Sequential

from jaxnitro.data.batch_at_check import check_batch_at
from jaxnitro.errors import ConfigError


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
