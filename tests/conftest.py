"""Strict numerics, four fake CPU devices, no persistent compile cache, a tmp cwd.

The programs compile with XLA's default CPU pipeline, the one users run: a faster
compile (LLVM at -O0, the classic emitters) took a third off the default tier but
would test another code generator than the one that ships.

JAX_PLATFORMS and XLA_FLAGS are defaults: a value in the environment wins
(scripts/device/tests.sh runs the tier on a TPU or a GPU with JAX_PLATFORMS=tpu,cpu
or cuda,cpu). A test marked `needs_sockets`, `needs_devices(n)` or `needs_processes`
is skipped, with the reason, where the machine lacks it
(tests/support/capabilities.py).
"""

import os
import time
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
os.environ["JAXNITRO_COMPILATION_CACHE"] = "off"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import pytest  # noqa: E402
from capabilities import missing  # noqa: E402

_STARTED = pytest.StashKey[float]()

jax.config.update("jax_numpy_rank_promotion", "raise")
if jax.default_backend() != "cpu":
    # A TPU multiplies float32 matrices in bfloat16 passes by default, a recent
    # NVIDIA GPU in TF32; the tests compare numbers with NumPy and Optax at float32
    # tolerances, so they ask for full precision. Users keep JAX's default.
    jax.config.update("jax_default_matmul_precision", "highest")


def pytest_collection_modifyitems(config, items):
    """Skip each test whose markers need what this machine lacks, naming it."""
    for item in items:
        reason = missing(item.iter_markers())
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(autouse=True)
def _in_tmp_dir(tmp_path, monkeypatch):
    """Every test runs in its own directory, so default run_dirs never collide."""
    monkeypatch.chdir(tmp_path)
    yield


@pytest.fixture(autouse=True)
def _config_report_on():
    from jaxnitro.observe.report import set_config_report

    previous = set_config_report(True)
    yield
    set_config_report(previous)


def pytest_addoption(parser):
    parser.addoption(
        "--staged",
        action="store_true",
        help="run the loop as on an accelerator: the prefetch threads stage every "
        "batch on the device (the CPU backend otherwise hands host arrays on)",
    )
    parser.addoption(
        "--time-limit",
        type=float,
        default=None,
        metavar="SECONDS",
        help="start no test after SECONDS from the session's start; the run stops "
        "as interrupted, with the summary of what ran (scripts/device/tests.sh)",
    )


TIME_LIMIT = "time limit of {limit:g} s reached: the tests after {nodeid} did not run"


def pytest_sessionstart(session):
    session.stash[_STARTED] = time.monotonic()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """Past --time-limit, stop before the next test (a signal would not do: a
    training test takes Ctrl+C as a request to stop the run)."""
    limit = item.config.getoption("--time-limit")
    if limit is None or nextitem is None:
        return
    started = item.session.stash.setdefault(_STARTED, time.monotonic())
    if time.monotonic() - started > limit:
        item.session.shouldstop = TIME_LIMIT.format(limit=limit, nodeid=item.nodeid)


@pytest.fixture(autouse=True)
def _auto_counts_per_test(monkeypatch):
    """Each test starts with no count "auto" remembers (`loop.call_count`): a
    handle's first epoch runs one step a call unless the test itself trained its
    train program's family before, as in a fresh process."""
    import collections

    import jaxnitro.loop.call_count as call_count

    monkeypatch.setattr(call_count, "_AUTO_CHOSEN", collections.OrderedDict())
    yield


@pytest.fixture(autouse=True)
def _staged(request, monkeypatch):
    """With --staged, the accelerator's data path runs on the CPU (CI runs both),
    the state passed leaf by leaf as that tier always ran it: a CPU's packing
    around each step, beside blocks staged at one step a call, would run those calls
    in the loop's program of the longer calls, and the tests of how many programs a
    run compiles count the accelerator's. Packing is tested in the default tier."""
    if request.config.getoption("--staged"):
        import jaxnitro.loop.calls as calls
        import jaxnitro.loop.feed as feed

        monkeypatch.setattr(feed, "stages_on_device", lambda: True)
        monkeypatch.setattr(calls, "pack_rule", lambda: None)
    yield


@pytest.fixture(autouse=True)
def _jsonl_logs_parse(tmp_path, monkeypatch):
    """Every JSON-lines log a JSONLogger wrote during the test reads with pandas, as
    a user's analysis would read it (`pd.read_json(path, lines=True)`). Other
    `.jsonl` files (a run file's data, damaged on purpose) are not logs."""
    from jaxnitro.logging.jsonl import JSONLogger

    written: set[str] = set()
    opened = JSONLogger._open

    def recording(self, *args, **kwargs):
        written.add(os.path.abspath(self.path))
        return opened(self, *args, **kwargs)

    monkeypatch.setattr(JSONLogger, "_open", recording)
    yield
    logs = sorted(
        Path(p)
        for p in written
        if Path(p).is_relative_to(tmp_path) and Path(p).exists()
    )
    if not logs:
        return
    import pandas as pd

    for path in logs:
        if path.stat().st_size:
            try:
                pd.read_json(path, lines=True)
            except ValueError as error:
                pytest.fail(f"{path} does not read with pandas: {error}")
