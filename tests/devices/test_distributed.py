"""A run across processes: the `dist` handle, joining a job (and the refusals when a
coordinator never answers), the global batch assembled from every process's rows, a
2-process run equal to a 1-process run, rank 0 alone writing, processes that feed
different data refused, and one rank's stop request ending every rank's evaluation."""

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from process_jobs import child_env, free_port

import jaxnitro as nx
from jaxnitro.devices import distributed, placement

SUPPORT = Path(__file__).parents[1] / "support"
SRC = Path(nx.__file__).parents[1]


def test_one_process_has_no_handle_rank_0_and_world_size_1():
    assert distributed.current_dist() is None
    assert (nx.rank(None), nx.world_size(None)) == (0, 1)
    assert distributed.is_rank0()


def test_a_handle_reports_its_rank_and_world_size():
    dist = nx.Distributed(1, 4, (), (), "127.0.0.1:9471")
    assert (nx.rank(dist), nx.world_size(dist), dist.is_rank0) == (1, 4, False)


def test_shard_gives_each_rank_its_slice_of_every_global_batch():
    rows = np.arange(20)
    parts = [nx.Distributed(r, 2, (), (), None).shard(rows, 8) for r in range(2)]
    assert parts[0].tolist() == [0, 1, 2, 3, 8, 9, 10, 11]
    assert parts[1].tolist() == [4, 5, 6, 7, 12, 13, 14, 15]  # 16-19: partial


def test_shard_refuses_a_global_batch_the_processes_do_not_divide():
    with pytest.raises(
        nx.ConfigError,
        match=r"Distributed.shard\(batch_size=9\): the global batch must divide by "
        r"the 2 processes",
    ):
        nx.Distributed(0, 2, (), (), None).shard(np.arange(18), 9)


@pytest.mark.needs_sockets
def test_a_coordinator_that_never_answers_is_named_with_the_timeout():
    port = free_port()  # nothing listens there
    start = time.monotonic()
    with pytest.raises(
        nx.DistributedError,
        match=rf"Process 1 of 2: the coordinator at 127.0.0.1:{port} did not answer "
        rf"within 1s \(initialization timeout\)\. Start rank 0",
    ):
        nx.init_distributed(f"127.0.0.1:{port}", 2, 1, timeout_s=1)
    assert time.monotonic() - start < 10


@pytest.mark.needs_sockets
def test_rank_0_refuses_a_coordinator_port_already_taken():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(
            nx.DistributedError,
            match=rf"Process 0 hosts the coordinator at 127.0.0.1:{port}, but port "
            rf"{port} is already in use on this host",
        ):
            nx.init_distributed(f"127.0.0.1:{port}", 2, 0)


@pytest.mark.needs_sockets
def test_joining_after_the_backend_started_names_the_fix():
    import jax

    jax.devices()  # the backend is in use (joining now would abort the process)
    with pytest.raises(
        nx.DistributedError,
        match=r"must run before anything uses a JAX backend.*Call "
        r"jaxnitro.init_distributed\(\) \(or setup_devices\(\)\) at the top",
    ):
        nx.init_distributed(f"127.0.0.1:{free_port()}", 2, 0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"coordinator": "node001", "num_processes": 2, "process_id": 0},
            r"coordinator='node001': it must be 'host:port'",
        ),
        (
            {"coordinator": "h:1", "num_processes": "two", "process_id": 0},
            r"num_processes='two': it must be a whole number >= 1",
        ),
        (
            {"coordinator": "h:1", "num_processes": 2, "process_id": 2},
            r"process_id=2 with num_processes=2: the ranks are 0 to 1",
        ),
        (
            {"coordinator": "h:1", "num_processes": 2, "process_id": 1, "timeout_s": 0},
            r"timeout_s=0: it must be a whole number >= 1",
        ),
    ],
)
def test_bad_job_settings_are_refused_by_name(kwargs, message):
    with pytest.raises(nx.ConfigError, match=message):
        nx.init_distributed(**kwargs)


@pytest.mark.needs_sockets
def test_the_environment_names_the_job(monkeypatch):
    port = free_port()
    monkeypatch.setenv(distributed.COORDINATOR_ENV, f"127.0.0.1:{port}")
    monkeypatch.setenv(distributed.NUM_PROCESSES_ENV, "3")
    monkeypatch.setenv(distributed.PROCESS_ID_ENV, "2")
    monkeypatch.setenv(distributed.INIT_TIMEOUT_ENV, "1")
    with pytest.raises(
        nx.DistributedError,
        match=rf"Process 2 of 3: the coordinator at 127.0.0.1:{port} did not answer "
        rf"within 1s",
    ):
        nx.setup_devices()


def test_each_process_batch_must_split_over_its_devices():
    placement.check_process_batch_divides(8, 2, 2)  # 16 over 4 devices
    with pytest.raises(
        nx.ConfigError,
        match=r"Each of the 2 processes feeds train batches of 6 samples \(a global "
        r"batch of 12 over 2 x 4 devices\), and 6 does not divide by its n_devs=4 "
        r"\(6 % 4 = 2\).*a global batch that divides by 8",
    ):
        placement.check_process_batch_divides(6, 4, 2)


def test_one_process_mesh_takes_a_prefix_of_its_devices():
    import jax

    assert placement.mesh_devices(2) == jax.local_devices()[:2]


def test_a_rank_other_than_0_logs_nothing_and_writes_no_checkpoint(monkeypatch):
    from experiments import Tiny

    from jaxnitro.checkpoint import checkpointer, lock
    from jaxnitro.run import setup, write_probe

    for module in (setup, checkpointer, lock, write_probe):
        monkeypatch.setattr(module, "is_rank0", lambda: False)
    nitro = nx.Nitro(Tiny(max_epochs=1), run_dir="run")
    assert nitro.logger is None
    nitro.train()
    assert nitro.current_epoch == 1
    assert not Path("run").exists()  # no log, no lock, no probe, no record


def _launch(args, *, devices=1, timeout=240, **extra):
    return subprocess.run(
        [sys.executable, "-m", "jaxnitro.cli", "launch", *args],
        env=child_env(devices, **extra),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _params(path) -> dict:
    return nx.Checkpointer().load(str(path)).field_arrays("params")


def _one_process(run_dir, *args):
    return subprocess.run(
        [sys.executable, str(SUPPORT / "dist_worker.py"), str(run_dir), "1", *args],
        env=child_env(1),
        capture_output=True,
        text=True,
        timeout=240,
    )


def _assert_same_params(expected_record, got_record):
    expected, got = _params(expected_record), _params(got_record)
    assert sorted(got) == sorted(expected) == ["b1", "w1", "w2"]
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-5, atol=1e-6)


@pytest.mark.needs_sockets
@pytest.mark.slow  # processes of their own
def test_two_processes_train_and_resume_as_one_process_on_the_same_batches(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    worker = str(SUPPORT / "dist_worker.py")
    single = _one_process(one)
    assert single.returncode == 0, single.stdout + single.stderr
    # A mesh of 4 devices: 2 of each process.
    pair = _launch(["-n", "2", "--timeout", "200", worker, str(two), "2"], devices=2)
    assert pair.returncode == 0, pair.stdout + pair.stderr
    assert "[rank 0] rank 0 of 2 done at step 8" in pair.stdout
    assert "[rank 1] rank 1 of 2 done at step 8" in pair.stdout
    # The steps' host inputs are placed without a collective check each.
    assert "[rank 0] equality checks across processes during train: 0" in pair.stdout
    # Rank 0 alone shows progress, logs and writes checkpoints.
    assert "[rank 0] epoch 2/2" in pair.stdout and "[rank 1] epoch" not in pair.stdout
    files = sorted(p.name for p in two.iterdir())
    assert files == sorted(p.name for p in one.iterdir())
    lines = [(run / "metrics.jsonl").read_text().splitlines() for run in (one, two)]
    assert len(lines[0]) == len(lines[1])
    manifest = json.loads((two / "manifest.json").read_text())
    assert [e["file"] for e in manifest["entries"]] == ["epoch-0002-step-8.safetensors"]
    _assert_same_params(
        one / "epoch-0002-step-8.safetensors", two / "epoch-0002-step-8.safetensors"
    )
    # Every rank restores from the directory rank 0 wrote, and trains on as one.
    single = _one_process(one, "0", "3")
    assert single.returncode == 0, single.stdout + single.stderr
    pair = _launch(
        ["-n", "2", "--timeout", "200", worker, str(two), "2", "0", "3"], devices=2
    )
    assert pair.returncode == 0, pair.stdout + pair.stderr
    assert "[rank 1] rank 1 of 2 done at step 12" in pair.stdout
    _assert_same_params(
        one / "epoch-0003-step-12.safetensors", two / "epoch-0003-step-12.safetensors"
    )


@pytest.mark.needs_sockets
@pytest.mark.slow  # processes of their own
def test_two_processes_in_calls_of_several_steps_train_as_one_process(tmp_path):
    """steps_per_call=3 across processes: each rank stacks its own rows of a block,
    the block is assembled along its batch axis, calls end at the agreement points
    and at the epoch's end (4 steps an epoch: calls of 3 and 1)."""
    one, two = tmp_path / "one", tmp_path / "two"
    worker = str(SUPPORT / "dist_worker.py")
    single = _one_process(one)
    assert single.returncode == 0, single.stdout + single.stderr
    pair = _launch(
        ["-n", "2", "--timeout", "200", worker, str(two), "2"],
        devices=2,
        NITRO_TEST_STEPS_PER_CALL="3",
    )
    assert pair.returncode == 0, pair.stdout + pair.stderr
    assert "[rank 1] rank 1 of 2 done at step 8 in calls of 3 steps" in pair.stdout
    _assert_same_params(
        one / "epoch-0002-step-8.safetensors", two / "epoch-0002-step-8.safetensors"
    )


@pytest.mark.needs_sockets
@pytest.mark.slow  # two processes of their own
def test_across_processes_different_data_is_refused_and_a_stop_stops_all(tmp_path):
    port = free_port()
    workers = [
        subprocess.Popen(
            [sys.executable, str(SUPPORT / "two_process_worker.py"), str(port), str(i)],
            cwd=tmp_path,
            env=child_env(1),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    outputs = [w.communicate(timeout=180)[0] for w in workers]
    for index, output in enumerate(outputs):
        assert f"joined: rank {index} of 2" in output, output
        # Rank 0 alone asked: both stopped after the first global batch of 8.
        assert "stopped evaluate: {'rows': 8}" in output, output
        assert (
            "uneven refused: DistributedError: The 2 processes of this run feed "
            "different data: train batches: rank 0 4, rank 1 3."
        ) in output, output
        assert (
            "uneven val refused: DistributedError: The 2 processes of this run feed "
            "different data: val batches: rank 0 2, rank 1 1."
        ) in output, output
        # Every rank refuses a part without rows alike (none waits on the other).
        assert (
            "empty part refused: ConfigError: Batch 1 of split `val`: rank 1 feeds "
            "0 of its rows (counts by rank: [2, 0])"
        ) in output, output


@pytest.mark.needs_sockets
@pytest.mark.slow  # three processes of their own
def test_the_launcher_stops_the_others_when_a_process_dies(tmp_path):
    start = time.monotonic()
    result = _launch(
        [
            "-n",
            "2",
            "--grace",
            "3",
            "--timeout",
            "200",
            str(SUPPORT / "dist_worker.py"),
            str(tmp_path / "run"),
            "1",
            "7",
        ],
    )
    assert result.returncode == 3, result.stdout + result.stderr
    assert (
        "nitro launch: rank 1 exited with status 3; stopping rank(s) 0 (SIGTERM, "
        "then SIGKILL after 3s)."
    ) in result.stderr
    assert "rank 0 of 2 done" not in result.stdout
    assert time.monotonic() - start < 200


@pytest.mark.needs_sockets
@pytest.mark.slow  # two processes of their own
def test_without_a_launcher_the_survivor_stops_after_the_heartbeat_timeout(tmp_path):
    port = free_port()
    job = {
        distributed.COORDINATOR_ENV: f"127.0.0.1:{port}",
        distributed.NUM_PROCESSES_ENV: "2",
        distributed.HEARTBEAT_TIMEOUT_ENV: "5",
    }
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                str(SUPPORT / "dist_worker.py"),
                str(tmp_path / "run"),
                "1",
                "7",
            ],
            env=child_env(1, **job, **{distributed.PROCESS_ID_ENV: str(i)}),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    outputs = [w.communicate(timeout=180)[0] for w in workers]
    assert workers[1].returncode == 3, outputs[1]
    assert workers[0].returncode != 0, outputs[0]
    assert "rank 0 of 2 done" not in outputs[0]
    assert "heartbeat" in outputs[0] and "another task died" in outputs[0], outputs[0]
