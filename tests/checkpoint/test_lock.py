"""The run-directory lock: shared within a process, refused across processes."""

from __future__ import annotations

import errno
import fcntl
import gc
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import experiments
import pytest
from experiments import Tiny
from foreign_lock import foreign_lock
from handle_parts import parts_of

import jaxnitro as nx
from jaxnitro import cli
from jaxnitro.checkpoint.lock import LOCK_NAME, holder, lock_run_dir
from jaxnitro.errors import CheckpointError, RunDirLockedError

SUPPORT = Path(experiments.__file__).resolve().parent  # what the processes import


def test_a_lock_names_this_process_and_is_dropped_at_the_last_release(tmp_path):
    directory = str(tmp_path / "run")
    first = lock_run_dir(directory, purpose="train")  # creates the directory
    second = lock_run_dir(directory, purpose="train")  # the same process: shared
    found = holder(directory)
    assert found is not None
    assert (found.pid, found.host) == (os.getpid(), socket.gethostname())
    first.release()
    first.release()  # a second release of one share does nothing
    assert holder(directory) is not None  # the other share still holds it
    second.release()
    assert holder(directory) is None
    assert repr(second) == f"RunDirLock({directory!r}, released)"


def test_a_second_holder_is_refused_naming_the_holders_pid_and_host(tmp_path):
    directory = str(tmp_path / "run")
    fd = foreign_lock(directory)
    try:
        with pytest.raises(RunDirLockedError) as refused:
            lock_run_dir(directory, purpose="train")
        assert holder(directory).pid == 4242
    finally:
        os.close(fd)
    error = refused.value
    assert isinstance(error, CheckpointError)
    assert (error.pid, error.host, error.directory) == (4242, "gpu-node-7", directory)
    message = str(error)
    assert f"The run directory {directory!r} is being written by another" in message
    assert "pid 4242 on host gpu-node-7 since 2026-12-01 10:00:00 UTC" in message
    assert "this train is refused" in message
    assert f'run_dir="{directory}-2"' in message
    assert "weights=, evaluate() and `nitro runs` work while it trains" in message
    # Closing the holder's file (its process ending) frees the directory.
    lock_run_dir(directory, purpose="train").release()


def test_a_holder_that_has_not_named_itself_yet_is_reported_as_such(tmp_path):
    directory = str(tmp_path / "run")
    os.makedirs(directory)
    fd = os.open(os.path.join(directory, LOCK_NAME), os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.raises(
            RunDirLockedError,
            match=r"pid \(not yet written\) on host \(not yet written\) holds",
        ) as refused:
            lock_run_dir(directory, purpose="resume")
    finally:
        os.close(fd)
    assert refused.value.pid is None and "this resume is refused" in str(refused.value)


def test_holder_of_a_directory_never_locked_is_none(tmp_path):
    assert holder(str(tmp_path)) is None
    assert not (tmp_path / LOCK_NAME).exists()  # asking creates nothing


# ------------------------------------------------------------ a handle's lock ---
@pytest.fixture(scope="module")
def trained_dir(tmp_path_factory):
    """A run directory one short run wrote (epochs 1-2); tests copy it."""
    directory = tmp_path_factory.mktemp("trained") / "run"
    nx.Nitro(Tiny(), run_dir=str(directory), logger=None).train()
    return directory


@pytest.fixture
def run_dir(trained_dir, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(trained_dir, copy)
    return str(copy)


def test_a_resume_locks_at_construction_and_train_lets_go(run_dir):
    nitro = nx.Nitro(Tiny(max_epochs=3), run_dir=run_dir, resume="auto", logger=None)
    assert holder(run_dir).pid == os.getpid()
    nitro.train()
    assert nitro.current_epoch == 3
    assert holder(run_dir) is None


def test_handles_of_one_process_share_the_lock_as_in_a_notebook(run_dir):
    first = nx.Nitro(Tiny(max_epochs=3), run_dir=run_dir, resume="auto", logger=None)
    # The cell run again: the first handle is still alive while the second builds.
    second = nx.Nitro(Tiny(max_epochs=3), run_dir=run_dir, resume="auto", logger=None)
    second.train()
    assert holder(run_dir).pid == os.getpid()  # the first still holds its share
    del first
    gc.collect()  # a dropped handle lets go
    assert holder(run_dir) is None


def test_release_lets_go_of_a_resume_handles_lock(run_dir):
    nitro = nx.Nitro(Tiny(max_epochs=3), run_dir=run_dir, resume="auto", logger=None)
    nitro.release()
    assert holder(run_dir) is None


def test_a_resume_into_a_directory_another_process_writes_is_refused_at_setup(run_dir):
    fd = foreign_lock(run_dir)
    try:
        with pytest.raises(
            RunDirLockedError, match=r"pid 4242 on host gpu-node-7 .*resume is refused"
        ):
            nx.Nitro(Tiny(max_epochs=3), run_dir=run_dir, resume="auto", logger=None)
    finally:
        os.close(fd)


def test_train_into_a_locked_directory_is_refused_before_any_step(run_dir):
    before = (Path(run_dir) / "manifest.json").read_bytes()
    nitro = nx.Nitro(Tiny(), run_dir=run_dir, logger=None)  # building writes nothing
    fd = foreign_lock(run_dir)
    try:
        with pytest.raises(RunDirLockedError, match=r"pid 4242.*this train is refused"):
            nitro.train()
    finally:
        os.close(fd)
    assert nitro.current_step == 0 and nitro.stop_reason is None
    assert (Path(run_dir) / "manifest.json").read_bytes() == before
    nitro.train()  # once the other process is gone, training goes ahead
    assert nitro.stop_reason == "completed"


def _files(directory):
    """Every file under `directory` (the lock file aside) with its bytes."""
    root = Path(directory)
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != LOCK_NAME
    }


@pytest.mark.parametrize("fresh", [False, True])
def test_a_process_refused_by_the_lock_writes_nothing_into_the_run_dir(run_dir, fresh):
    """With the default logger: the params and binding-report lines wait for the
    lock, so a refused train() leaves the winner's metrics.jsonl as it was."""
    if fresh:
        shutil.rmtree(run_dir)
    fd = foreign_lock(run_dir)
    before = _files(run_dir)
    try:
        nitro = nx.Nitro(Tiny(), run_dir=run_dir)
        with pytest.raises(RunDirLockedError, match="this train is refused"):
            nitro.train()
        assert _files(run_dir) == before
    finally:
        os.close(fd)
    nitro.train()  # the other process is gone: the lines come before training's
    lines = [
        json.loads(line)
        for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    ]
    mine = [line for line in lines if line["run_id"] == nitro.prepared.run_id]
    assert [line["type"] for line in mine[:2]] == ["params", "other"]
    assert mine[1]["key"] == "binding_report"
    assert sum(line["type"] == "params" for line in mine) == 1


def test_a_verb_other_than_train_logs_the_setup_lines_first(run_dir):
    record = nx.checkpoint.find_latest(None, run_dir)
    nitro = nx.Nitro(Tiny(), run_dir=run_dir, weights=record)
    log = Path(run_dir) / "metrics.jsonl"
    assert not log.exists()  # the directory was written with logger=None
    count = 0
    nitro.evaluate("val")
    nitro.evaluate("val")
    new = [json.loads(line) for line in log.read_text().splitlines()[count:]]
    assert [line["type"] for line in new[:2]] == ["params", "other"]
    assert sum(line["type"] == "params" for line in new) == 1


def test_reading_a_locked_directory_needs_no_lock(run_dir, capsys):
    record = nx.checkpoint.find_latest(None, run_dir)
    fd = foreign_lock(run_dir)
    try:
        reader = nx.Nitro(Tiny(), run_dir=run_dir, weights=record, logger=None)
        assert set(reader.evaluate("val")) == {"loss"}
        assert cli.main(["runs", run_dir]) == 0
        assert "epochs" in capsys.readouterr().out
    finally:
        os.close(fd)


def test_a_run_without_a_checkpointer_locks_nothing(run_dir):
    fd = foreign_lock(run_dir)
    try:
        nitro = nx.Nitro(Tiny(), run_dir=run_dir, logger=None, checkpointer=None)
        nitro.train()
    finally:
        os.close(fd)
    assert nitro.stop_reason == "completed"


# ------------------------------------------------------------- real processes ---
WRITER = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, sys.argv[1])
    import jaxnitro as nx
    from experiments import Tiny

    resume = "auto" if sys.argv[2] == "resume" else None
    try:
        nitro = nx.Nitro(Tiny(max_epochs=3), run_dir="run", resume=resume)
    except nx.RunDirLockedError as error:
        print("refused", error.pid, error.host, flush=True)
        sys.exit(3)
    open(f"ready-{os.getpid()}", "w").close()
    while not os.path.exists(sys.argv[3]):
        time.sleep(0.01)
    try:
        nitro.train()
    except nx.RunDirLockedError as error:
        print("refused", error.pid, error.host, flush=True)
        sys.exit(3)
    print("trained", os.getpid(), nitro.current_epoch, flush=True)
    """
)


def _writer(cwd, mode, go):
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(SUPPORT), mode, go],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "JAXNITRO_COMPILATION_CACHE": "off"},
    )


def _wait_for(predicate, processes, timeout=120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        for process in processes:
            if process.poll() is not None and not predicate():
                raise AssertionError(f"exited early: {process.communicate()}")
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s")


def _finish(processes, timeout=180.0):
    outs = []
    try:
        for process in processes:
            out, err = process.communicate(timeout=timeout)
            outs.append((process.returncode, out, err))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.communicate()
    return outs


@pytest.mark.needs_processes
@pytest.mark.slow  # four training processes
def test_four_processes_training_into_one_directory_leave_one_writer(tmp_path):
    processes = [_writer(tmp_path, "fresh", "go") for _ in range(4)]
    _wait_for(lambda: len(list(tmp_path.glob("ready-*"))) == 4, processes)
    (tmp_path / "go").touch()  # all four call train() at once
    results = _finish(processes)
    trained = [out.split() for rc, out, _ in results if rc == 0]
    refused = [out.split() for rc, out, _ in results if rc == 3]
    assert len(trained) == 1 and len(refused) == 3, results
    winner = trained[0][1]
    assert trained[0][2] == "3"
    # A refusal names the winner, or "not yet written" when it read the lock file
    # between the winner's flock and its write of its name (seen in CI, rarely).
    named = ["refused", winner, socket.gethostname()]
    assert all(r in (named, ["refused", "None", "None"]) for r in refused), refused
    entries = nx.read_manifest(str(tmp_path / "run"))  # intact, one run's
    assert sorted(e.epoch for e in entries) == [1, 2, 3][-len(entries) :]
    assert len({e.run for e in entries}) == 1
    assert all((tmp_path / "run" / e.file).is_file() for e in entries)
    # The refused three wrote nothing, not even a params line in the log.
    log = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len({json.loads(line)["run_id"] for line in log}) == 1
    assert sum(json.loads(line)["type"] == "params" for line in log) == 1


@pytest.mark.needs_processes
@pytest.mark.slow  # two resuming processes, one killed
def test_a_second_resume_of_one_run_is_refused_until_the_first_is_killed(
    run_dir, tmp_path
):
    first = _writer(tmp_path, "resume", "never")  # resumes, then waits
    try:
        _wait_for(lambda: any(tmp_path.glob("ready-*")), [first])
        [(rc, out, err)] = _finish([_writer(tmp_path, "resume", "go")])
        assert rc == 3, err
        assert out.split() == ["refused", str(first.pid), socket.gethostname()]
    finally:
        first.kill()  # SIGKILL: the kernel drops its lock
        first.communicate()
    (tmp_path / "go").touch()
    [(rc, out, err)] = _finish([_writer(tmp_path, "resume", "go")])
    assert rc == 0, err
    assert out.split()[0] == "trained" and out.split()[2] == "3"


def test_a_directory_that_cannot_be_created_is_refused_by_name(tmp_path):
    (tmp_path / "file").write_text("")  # a run_dir under a file: even root fails
    with pytest.raises(
        CheckpointError,
        match=r"cannot be written \(Not a directory\): this train needs to create "
        r"its lock file .*Pass a writable run_dir",
    ):
        lock_run_dir(str(tmp_path / "file" / "run"), purpose="train")


def test_a_file_system_without_flock_runs_unlocked_with_a_warning(
    tmp_path, monkeypatch
):
    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with pytest.warns(
        nx.NitroWarning,
        match=r"cannot be locked \(\[Errno \d+\] No locks available\): its file "
        r"system does not support flock\. The run goes ahead unlocked",
    ):
        assert lock_run_dir(str(tmp_path), purpose="train") is None


def test_a_resume_from_a_read_only_directory_locks_nothing(tmp_path, monkeypatch):
    """Nothing can write a read-only directory, so a resume handle built there to
    evaluate takes no lock (train() is refused by the write probe instead: see
    tests/run/test_write_probe.py)."""
    from jaxnitro.checkpoint import lock as lock_module

    nx.Nitro(Tiny(max_epochs=1), run_dir=str(tmp_path), logger=None).train()

    def read_only(directory, *, purpose):
        error = OSError(errno.EROFS, "Read-only file system")
        raise lock_module._unwritable(directory, directory, purpose, error) from error

    monkeypatch.setattr(lock_module, "lock_run_dir", read_only)
    resumed = nx.Nitro(Tiny(), run_dir=str(tmp_path), resume="auto", logger=None)
    assert not parts_of(resumed).lock.held
    assert set(resumed.evaluate("test")) == {"loss"}
