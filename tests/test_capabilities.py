"""The markers of what a test needs (`needs_sockets`, `needs_devices(n)`,
`needs_processes`): skipped with the reason naming what is missing, run when it is
there. The machine's capabilities are monkeypatched, so this holds anywhere."""

import os
import re
import socket

import capabilities
import pytest


@pytest.fixture
def machine(monkeypatch):
    """A machine with loopback, 4 CPU devices; a test takes away what it needs."""
    monkeypatch.setattr(capabilities, "loopback_error", lambda: None)
    monkeypatch.setattr(capabilities, "socketpair_error", lambda: None)
    monkeypatch.setattr(capabilities, "device_count", lambda: 4)
    monkeypatch.setattr(capabilities, "default_backend", lambda: "cpu")
    return monkeypatch


def marks(*decorators):
    return [decorator.mark for decorator in decorators]


def test_a_machine_that_has_everything_skips_nothing(machine):
    needs = marks(
        pytest.mark.needs_sockets,
        pytest.mark.needs_sockets("pair"),
        pytest.mark.needs_devices(4),
        pytest.mark.needs_processes,
        pytest.mark.slow,
    )
    assert capabilities.missing(needs) is None


def test_without_loopback_a_test_that_opens_a_socket_is_skipped(machine):
    machine.setattr(capabilities, "loopback_error", lambda: "OSError: unreachable")
    assert capabilities.missing(marks(pytest.mark.needs_sockets)) == (
        "needs sockets: a TCP socket on 127.0.0.1 cannot bind and connect here "
        "(OSError: unreachable)"
    )
    assert capabilities.missing(marks(pytest.mark.needs_sockets("tcp"))) == (
        capabilities.missing(marks(pytest.mark.needs_sockets))
    )
    assert capabilities.missing(marks(pytest.mark.needs_sockets("pair"))) is None
    assert capabilities.missing(marks(pytest.mark.needs_devices(4))) is None


def test_without_a_socketpair_a_test_running_an_event_loop_is_skipped(machine):
    machine.setattr(capabilities, "socketpair_error", lambda: "PermissionError: no")
    assert capabilities.missing(marks(pytest.mark.needs_sockets("pair"))) == (
        "needs sockets: socket.socketpair(), which an asyncio event loop makes, fails "
        "here (PermissionError: no)"
    )
    assert capabilities.missing(marks(pytest.mark.needs_sockets)) is None


@pytest.mark.parametrize(
    "mark",
    [
        pytest.mark.needs_sockets("udp"),
        pytest.mark.needs_sockets("tcp", "pair"),
        pytest.mark.needs_sockets(kind="pair"),
    ],
    ids=["unknown", "two", "keyword"],
)
def test_needs_sockets_takes_one_known_kind(machine, mark):
    args, kwargs = tuple(mark.mark.args), dict(mark.mark.kwargs)
    message = capabilities.SOCKETS_ARGUMENT.format(args=args, kwargs=kwargs)
    assert message.startswith("needs_sockets takes no argument")
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        capabilities.missing([mark.mark])


def test_with_fewer_devices_a_test_needing_more_is_skipped(machine):
    machine.setattr(capabilities, "device_count", lambda: 1)
    machine.setattr(capabilities, "default_backend", lambda: "tpu")
    assert capabilities.missing(marks(pytest.mark.needs_devices(2))) == (
        "needs 2 devices of the default backend; this process has 1 (tpu)"
    )
    assert capabilities.missing(marks(pytest.mark.needs_devices(1))) is None


def test_on_an_accelerator_a_test_starting_processes_on_it_is_skipped(machine):
    assert capabilities.missing(marks(pytest.mark.needs_processes)) is None
    machine.setattr(capabilities, "default_backend", lambda: "tpu")
    assert capabilities.missing(marks(pytest.mark.needs_processes)) == (
        "starts processes on the default backend; only one process can hold the tpu "
        "devices, and this one does"
    )


def test_every_missing_need_is_named_once(machine):
    machine.setattr(capabilities, "loopback_error", lambda: "OSError: no network")
    machine.setattr(capabilities, "device_count", lambda: 1)
    needs = marks(
        pytest.mark.needs_devices(4),
        pytest.mark.needs_sockets,
        pytest.mark.needs_sockets,
    )
    assert capabilities.missing(needs) == (
        "needs 4 devices of the default backend; this process has 1 (cpu); needs "
        "sockets: a TCP socket on 127.0.0.1 cannot bind and connect here (OSError: no "
        "network)"
    )


@pytest.mark.parametrize(
    "mark",
    [
        pytest.mark.needs_devices,
        pytest.mark.needs_devices(0),
        pytest.mark.needs_devices("4"),
        pytest.mark.needs_devices(True),
        pytest.mark.needs_devices(2, 4),
        pytest.mark.needs_devices(n=4),
    ],
    ids=["none", "zero", "str", "bool", "two", "keyword"],
)
def test_needs_devices_takes_one_whole_number(machine, mark):
    args, kwargs = tuple(mark.mark.args), dict(mark.mark.kwargs)
    message = capabilities.DEVICES_ARGUMENT.format(args=args, kwargs=kwargs)
    assert message.startswith("needs_devices takes one whole number >= 1")
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        capabilities.missing([mark.mark])


@pytest.mark.parametrize(
    ("probe", "call"),
    [
        (capabilities.loopback_error, "socket"),
        (capabilities.socketpair_error, "socketpair"),
    ],
    ids=["tcp", "pair"],
)
def test_the_socket_probes_report_the_error_they_met(monkeypatch, probe, call):
    def refused(*args, **kwargs):
        raise PermissionError(1, "Operation not permitted")

    probe.cache_clear()
    monkeypatch.setattr(socket, call, refused)
    try:
        assert probe() == "PermissionError: [Errno 1] Operation not permitted"
    finally:
        probe.cache_clear()


class Item:
    """What the collection hook reads of a test item: its marks; what it adds."""

    def __init__(self, *decorators):
        self.marks = marks(*decorators)
        self.added = []

    def iter_markers(self):
        return iter(self.marks)

    def add_marker(self, decorator):
        self.added.append(decorator.mark)


def the_conftest(config):
    """tests/conftest.py, as pytest loaded it."""
    path = os.path.join(os.path.dirname(__file__), "conftest.py")
    return next(
        plugin
        for plugin in config.pluginmanager.get_plugins()
        if getattr(plugin, "__file__", "") == path
    )


def test_the_collection_hook_skips_with_the_reason_what_is_missing(machine, request):
    conftest = the_conftest(request.config)
    machine.setattr(capabilities, "device_count", lambda: 1)
    mesh, plain = Item(pytest.mark.needs_devices(4)), Item(pytest.mark.slow)
    sockets = Item(pytest.mark.needs_sockets)
    conftest.pytest_collection_modifyitems(request.config, [mesh, plain, sockets])
    [skip] = mesh.added
    assert (skip.name, skip.kwargs) == (
        "skip",
        {"reason": "needs 4 devices of the default backend; this process has 1 (cpu)"},
    )
    assert plain.added == sockets.added == []


def test_past_the_time_limit_no_further_test_starts(request):
    """scripts/device/tests.sh passes --time-limit: the run stops between tests, as
    interrupted, rather than by a signal a training test would take for Ctrl+C."""
    conftest = the_conftest(request.config)
    limits = {"--time-limit": 60.0}

    class Config:
        def getoption(self, name):
            return limits[name]

    class Session:
        def __init__(self, elapsed):
            self.stash = {conftest._STARTED: conftest.time.monotonic() - elapsed}
            self.shouldstop = False

    class TimedItem:
        config, nodeid = Config(), "tests/test_x.py::test_y"

        def __init__(self, elapsed):
            self.session = Session(elapsed)

    early, late, last = TimedItem(10.0), TimedItem(61.0), TimedItem(61.0)
    conftest.pytest_runtest_teardown(early, nextitem=object())
    conftest.pytest_runtest_teardown(late, nextitem=object())
    conftest.pytest_runtest_teardown(last, nextitem=None)  # nothing after it
    assert (early.session.shouldstop, last.session.shouldstop) == (False, False)
    assert late.session.shouldstop == (
        "time limit of 60 s reached: the tests after tests/test_x.py::test_y did not "
        "run"
    )
    limits["--time-limit"] = None
    unlimited = TimedItem(1e6)
    conftest.pytest_runtest_teardown(unlimited, nextitem=object())
    assert unlimited.session.shouldstop is False
