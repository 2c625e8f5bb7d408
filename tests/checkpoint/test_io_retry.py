"""with_io_retry: transient errors retried with backoff, others raised at once, and a
checkpoint write that survives a transient rename failure.
"""

import errno
import logging
import os

import pytest
from checkpoint_fixtures import bound, write

import jaxnitro as nx
from jaxnitro.checkpoint.io_retry import is_transient_io, with_io_retry
from jaxnitro.checkpoint.manifest import read_manifest
from jaxnitro.checkpoint.selectors import Last


class Flaky:
    def __init__(self, errors, result="done"):
        self.errors = list(errors)
        self.calls = 0
        self.result = result

    def __call__(self):
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return self.result


def test_with_io_retry_retries_transient_errors_with_exponential_backoff(caplog):
    waits = []
    flaky = Flaky([OSError(errno.EBUSY, "busy"), OSError(errno.EAGAIN, "again")])
    with caplog.at_level(logging.WARNING, logger="jaxnitro.checkpoint"):
        assert with_io_retry(flaky, sleep=waits.append, what="writing x") == "done"
    assert flaky.calls == 3 and waits == [0.5, 1.0]
    assert "writing x failed with a transient error" in caplog.text
    assert "retry 2 of 4 in 1.00 s" in caplog.text


def test_with_io_retry_reraises_other_errors_at_once_and_the_last_transient_one():
    waits = []
    missing = Flaky([FileNotFoundError(errno.ENOENT, "gone")])
    with pytest.raises(FileNotFoundError):
        with_io_retry(missing, sleep=waits.append)
    assert missing.calls == 1 and waits == []
    full = Flaky([OSError(errno.ENOSPC, "full")])
    with pytest.raises(OSError, match="full"):
        with_io_retry(full, sleep=waits.append)
    assert full.calls == 1
    stuck = Flaky([TimeoutError(errno.ETIMEDOUT, "slow")] * 9)
    with pytest.raises(TimeoutError):
        with_io_retry(stuck, attempts=3, backoff=0.1, sleep=waits.append)
    assert stuck.calls == 3 and waits == [0.1, 0.2]
    bug = Flaky([ValueError("a bug")])
    with pytest.raises(ValueError):
        with_io_retry(bug, sleep=waits.append)


def test_is_transient_io():
    assert is_transient_io(InterruptedError())
    assert is_transient_io(OSError(errno.ESTALE, "stale"))
    assert not is_transient_io(OSError(errno.EIO, "device"))
    assert not is_transient_io(RuntimeError())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"attempts": 0}, "needs attempts >= 1, got 0"),
        ({"backoff": -1.0}, "needs backoff >= 0, got -1.0"),
    ],
)
def test_with_io_retry_validates_its_options(kwargs, message):
    with pytest.raises(nx.ConfigError, match=message):
        with_io_retry(lambda: 1, **kwargs)


def test_a_checkpoint_write_survives_a_transient_rename_failure(tmp_path, monkeypatch):
    real_replace = os.replace
    failures = [OSError(errno.EBUSY, "busy")]

    def flaky_replace(src, dst):
        if failures:
            raise failures.pop()
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", flaky_replace)
    monkeypatch.setattr("jaxnitro.checkpoint.io_retry.time.sleep", lambda s: None)
    ckpt = bound(tmp_path, keep=Last(1))
    assert write(ckpt, 1, 0.5)
    assert not failures and len(read_manifest(str(tmp_path))) == 1
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".tmp")]
