import threading

import pytest

from jaxnitro.agent.registry import RunRegistry
from jaxnitro.errors import ConfigError


def test_a_failed_run_keeps_its_error_and_traceback():
    registry = RunRegistry()

    def work(run):
        raise RuntimeError("work failed")

    run = registry.start("train", "x", build=lambda run: None, work=work)
    run.join(10)
    assert run.state == "failed"
    assert run.error == "RuntimeError: work failed"
    assert 'raise RuntimeError("work failed")' in run.traceback


def test_starts_past_the_limit_are_refused_with_the_reason():
    registry = RunRegistry(max_active=1)
    release = threading.Event()
    first = registry.start(
        "train", "a", build=lambda run: None, work=lambda run: release.wait(10)
    )
    with pytest.raises(ConfigError, match=r"1 runs are active \(r1\).*at most 1"):
        registry.start("train", "b", build=lambda run: None, work=lambda run: None)
    release.set()
    first.join(10)
    second = registry.start("train", "b", build=lambda run: None, work=lambda run: 2)
    second.join(10)
    assert (second.id, second.result) == ("r2", 2)


def test_shutdown_refuses_new_runs():
    registry = RunRegistry()
    assert registry.shutdown(1.0) == []
    with pytest.raises(ConfigError, match="shutting down"):
        registry.start("train", "a", build=lambda run: None, work=lambda run: None)


def test_an_unknown_id_lists_the_known_ones():
    registry = RunRegistry()
    registry.start("train", "a", build=lambda run: None, work=lambda run: 1).join(10)
    with pytest.raises(ConfigError, match="no run 'r9' on this server. Its runs: r1"):
        registry.get("r9")


@pytest.mark.parametrize("value", [0, 1.5, True])
def test_max_active_is_checked(value):
    with pytest.raises(ConfigError, match="max_active must be"):
        RunRegistry(max_active=value)
