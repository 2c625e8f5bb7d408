"""The setup probe of the run's output directories: an unwritable run directory is
refused at construction (or, for a handle that loads weights, at train() before any
work), while a handle built to evaluate or predict from a read-only directory works."""

import contextlib
import errno
import os
import stat
import subprocess

import numpy as np
import pytest
from experiments import Tiny

import jaxnitro as nx
from jaxnitro.run import write_probe


def read_only_error(*args, **kwargs):
    raise OSError(errno.EROFS, "Read-only file system")


@pytest.fixture
def trained(tmp_path):
    """A one-epoch Tiny run in tmp_path/run, trained while it was writable."""
    run_dir = tmp_path / "run"
    nx.Nitro(Tiny(max_epochs=1), run_dir=str(run_dir), logger=None).train()
    return run_dir


@pytest.fixture
def probe_fails(monkeypatch):
    """Every probe write fails as on a read-only mount (works as root too)."""
    monkeypatch.setattr(write_probe.tempfile, "mkstemp", read_only_error)


def test_a_fresh_run_in_an_unwritable_directory_is_refused_at_setup(
    tmp_path, probe_fails
):
    run_dir = str(tmp_path / "run")
    with pytest.raises(nx.ConfigError) as caught:
        nx.Nitro(Tiny(), run_dir=run_dir, logger=None)
    text = str(caught.value)
    assert text.startswith(
        f"{run_dir} cannot be written ([Errno 30] Read-only file system), and the "
        f"checkpointer writes there: setup wrote a small test file"
    )
    assert "Pass a run_dir this process can write" in text and "logger=None" in text


def test_a_file_logger_in_an_unwritable_directory_is_refused_at_setup(
    trained, probe_fails
):
    # The logger writes the run's parameters at construction, so even a handle
    # that only evaluates needs its directory writable.
    with pytest.raises(nx.ConfigError, match=r"and the JSONLogger writes there"):
        nx.Nitro(Tiny(), run_dir=str(trained), resume="auto", checkpointer=None)


def test_a_handle_that_loads_weights_evaluates_and_refuses_only_train(
    trained, probe_fails
):
    nitro = nx.Nitro(
        Tiny(max_epochs=2), run_dir=str(trained), resume="auto", logger=None
    )
    assert nitro.current_epoch == 1
    assert set(nitro.validate()) == {"loss"}
    assert nitro.predict({"x": np.ones((2, 8), np.float32)}).shape == (2, 3)
    with pytest.raises(nx.ConfigError, match=r"cannot be written .*checkpointer"):
        nitro.train()
    assert nitro.current_epoch == 1  # refused before any work


def test_no_checkpointer_and_no_logger_probe_nothing(probe_fails):
    nitro = nx.Nitro(Tiny(max_epochs=1), logger=None, checkpointer=None)
    nitro.train()
    assert nitro.current_epoch == 1


def test_the_probe_leaves_nothing_behind(tmp_path):
    run_dir = tmp_path / "run"
    nx.Nitro(Tiny(), run_dir=str(run_dir), logger=None)
    assert os.listdir(run_dir) == []  # created as the run would, and left empty


@contextlib.contextmanager
def read_only(directory):
    """`directory` made read-only for real: by its mode for an ordinary user, by a
    read-only bind mount for root (whom a mode does not stop)."""
    if os.geteuid() != 0:
        mode = os.stat(directory).st_mode
        for root, dirs, _ in os.walk(directory):
            for name in [root, *[os.path.join(root, d) for d in dirs]]:
                os.chmod(name, 0o555)
        try:
            yield
        finally:
            for root, dirs, _ in os.walk(directory):
                for name in [root, *[os.path.join(root, d) for d in dirs]]:
                    os.chmod(name, stat.S_IMODE(mode))
        return
    bind = subprocess.run(["mount", "--bind", directory, directory], check=False)
    if bind.returncode != 0:
        pytest.skip("root here cannot bind-mount, so cannot make a read-only dir")
    try:
        subprocess.run(
            ["mount", "-o", "remount,ro,bind", directory, directory], check=True
        )
        yield
    finally:
        subprocess.run(["umount", directory], check=True)


@pytest.mark.slow
def test_a_really_read_only_run_directory(trained):
    run_dir = str(trained)
    before = sorted(os.listdir(run_dir))
    with read_only(run_dir):
        with pytest.raises(OSError):  # the directory really refuses a write
            open(os.path.join(run_dir, "x"), "w").close()
        resumed = nx.Nitro(Tiny(), run_dir=run_dir, resume="auto", logger=None)
        assert set(resumed.evaluate("test")) == {"loss"}
        record = os.path.join(run_dir, [f for f in before if "epoch" in f][0])
        loaded = nx.Nitro(Tiny(), run_dir=run_dir, weights=record, logger=None)
        assert loaded.predict({"x": np.ones((2, 8), np.float32)}).shape == (2, 3)
        with pytest.raises(nx.ConfigError, match=r"cannot be written"):
            resumed.train()
        with pytest.raises(nx.ConfigError, match=r"checkpointer writes there"):
            nx.Nitro(Tiny(), run_dir=run_dir, logger=None)
        with pytest.raises(nx.ConfigError, match=r"JSONLogger writes there"):
            nx.Nitro(Tiny(), run_dir=run_dir, resume="auto")
    assert sorted(os.listdir(run_dir)) == before
