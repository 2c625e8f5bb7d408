"""The stop every rank agrees on: the vote in one process (its own flags), where
the agreement points fall, and two processes of which one alone asks to stop,
both stopping at the same step and resuming to the straight run's weights."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from process_jobs import child_env, free_port

import jaxnitro as nx
from jaxnitro.devices import agreement
from jaxnitro.devices.agreement import StopAgreement, StopVote, agree_stop

SUPPORT = Path(__file__).parents[1] / "support"
SRC = Path(nx.__file__).parents[1]


@pytest.mark.parametrize("requested", [False, True])
@pytest.mark.parametrize("preempted", [False, True])
def test_in_one_process_the_vote_is_the_process_own_flags(requested, preempted):
    vote = agree_stop(requested, preempted=preempted, seconds_per_step=0.25)
    assert vote == StopVote(requested, preempted, 0.25)


def test_the_interval_aims_at_half_a_second_within_1_to_16_steps():
    assert agreement.AGREE_SECONDS == 0.5 and agreement.AGREE_MOST_STEPS == 16
    seconds = (0.0, 0.001, 0.05, 0.1, 0.4, 9.0)
    steps = [agreement.agree_interval(s) for s in seconds]
    assert steps == [16, 16, 10, 5, 1, 1]


def test_the_agreement_starts_after_the_first_step_and_keeps_a_stop():
    agreed = StopAgreement(step=10)
    assert agreed.next_at == 11
    assert (agreed.stop_requested, agreed.preempted) == (False, False)
    # No step since the last point: the step time is unknown, the interval stays 1.
    assert agreed.vote(10, False, False) == 11
    # One step measured (microseconds here): the next point is 1 to 16 steps on.
    assert 12 <= agreed.vote(11, False, False) <= 27
    assert not agreed.stop_requested
    agreed.vote(agreed.next_at, True, True)
    assert (agreed.stop_requested, agreed.preempted) == (True, True)
    agreed.vote(agreed.next_at, False, False)  # the stop holds for the train()
    assert (agreed.stop_requested, agreed.preempted) == (True, True)


def _run(args: list[str], *, launch: bool) -> subprocess.CompletedProcess:
    # Across processes a mesh of 4 devices, 2 of each process; alone, 1 device.
    worker = [str(SUPPORT / "dist_stop_worker.py"), *args, "2" if launch else "1"]
    command = ["-m", "jaxnitro.cli", "launch", "-n", "2", "--timeout", "150"]
    return subprocess.run(
        [sys.executable, *(command if launch else []), *worker],
        env=child_env(2),
        capture_output=True,
        text=True,
        timeout=200,
    )


def _params(path: Path) -> dict:
    return nx.Checkpointer().load(str(path)).field_arrays("params")


@pytest.mark.needs_sockets
@pytest.mark.slow  # three processes of their own
def test_one_rank_stop_stops_every_rank_at_one_step_and_resumes_exactly(tmp_path):
    two, one = tmp_path / "two", tmp_path / "one"
    stopped = _run([str(two), "3", "1"], launch=True)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    # Rank 0 alone asked (after step 5); both left at the agreement point, step 6.
    for rank in (0, 1):
        line = f"[rank {rank}] rank {rank} of 2 ended at step 6: requested"
        assert line in stopped.stdout, stopped.stdout + stopped.stderr
    manifest = json.loads((two / "manifest.json").read_text())
    written = [e["file"] for e in manifest["entries"]]
    assert written[-1] == "epoch-0002-step-6.safetensors"  # rank 0 wrote the stop's
    resumed = _run([str(two), "3", "0"], launch=True)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "[rank 1] rank 1 of 2 ended at step 12: completed" in resumed.stdout
    straight = _run([str(one), "3", "0"], launch=False)
    assert straight.returncode == 0, straight.stdout + straight.stderr
    assert "rank 0 of 1 ended at step 12: completed" in straight.stdout
    expected = _params(one / "epoch-0003-step-12.safetensors")
    got = _params(two / "epoch-0003-step-12.safetensors")
    assert sorted(got) == sorted(expected) == ["b1", "w1", "w2"]
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-5, atol=1e-6)


@pytest.mark.needs_sockets
@pytest.mark.slow  # two processes of their own
def test_a_sigterm_on_one_rank_preempts_every_rank_at_one_step(tmp_path):
    port = free_port()
    job = {"NITRO_COORDINATOR": f"127.0.0.1:{port}", "NITRO_NUM_PROCESSES": "2"}
    worker = [str(SUPPORT / "dist_stop_worker.py"), str(tmp_path), "3", "2", "2"]
    ranks = [
        subprocess.Popen(
            [sys.executable, *worker],
            env={**child_env(2), **job, "NITRO_PROCESS_ID": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    try:
        outputs = [p.communicate(timeout=150)[0] for p in ranks]
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
    # Rank 0 got the SIGTERM: it checkpoints at the agreed step and exits 143.
    assert ranks[0].returncode == 143, outputs[0]
    assert "jaxnitro: preempted (SIGTERM): stopped at epoch 2, step 6;" in outputs[0]
    # Rank 1 did not: it stops at the same step, preempted too, and exits 0.
    assert ranks[1].returncode == 0, outputs[1]
    assert "rank 1 of 2 ended at step 6: preempted" in outputs[1], outputs[1]
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    written = [e["file"] for e in manifest["entries"]]
    assert written[-1] == "epoch-0002-step-6.safetensors"
