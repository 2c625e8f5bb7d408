"""Strict numerics, four fake CPU devices, no persistent compile cache, a tmp cwd.

The programs compile with XLA's default CPU pipeline, the one users run: a faster
compile (LLVM at -O0, the classic emitters) took a third off the default tier but
would test another code generator than the one that ships.
"""

import os
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
os.environ["JAXNITRO_COMPILATION_CACHE"] = "off"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")


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


@pytest.fixture(autouse=True)
def _staged(request, monkeypatch):
    """With --staged, the accelerator's data path runs on the CPU (CI runs both)."""
    if request.config.getoption("--staged"):
        import jaxnitro.loop.feed as feed

        monkeypatch.setattr(feed, "stages_on_device", lambda: True)
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
