"""The source protocol: the traits, the epoch token, releasing a handle's sources."""

import numpy as np
import pytest
from toy_sources import Indexed, Sequential, drain

from jaxnitro.data.prefetch import (
    NoPrefetch,
    PrefetchIterator,
    auto_prefetch,
    batch_stream,
)
from jaxnitro.data.protocol import (
    BatchSource,
    IndexedSource,
    epoch_token,
    fanout_capable,
    release_splits,
)
from jaxnitro.errors import ConfigError, NitroWarning


def test_protocols_and_fanout_capable():
    assert isinstance(Indexed(), IndexedSource) and isinstance(
        Sequential(), BatchSource
    )
    assert fanout_capable(Indexed()) and fanout_capable(PrefetchIterator(Indexed()))
    assert not fanout_capable(Sequential()) and not fanout_capable([])


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
    assert len(drain(batch_stream(PrefetchIterator(advancing, workers=2), ("x",))))
    assert epoch_token(advancing) == 5 and type(epoch_token(advancing)) is int
    for flag in (True, np.True_):
        advancing.epoch_token = flag
        assert epoch_token(advancing) is None


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
