"""`nitro launch`: N processes of one script with the job's environment, their
output prefixed by rank, stopped together when one fails or time runs out."""

import io
import time

import pytest

from jaxnitro import cli
from jaxnitro.devices import launch

PRINTS_ITS_RANK = (
    "import os; print(os.environ['NITRO_PROCESS_ID'], 'of', "
    "os.environ['NITRO_NUM_PROCESSES'], 'via', os.environ['NITRO_COORDINATOR'])"
)


def test_each_process_gets_the_job_environment():
    env = launch.rank_environment(2, 4, 9471, heartbeat_s=5)
    assert env["NITRO_COORDINATOR"] == "127.0.0.1:9471"
    assert (env["NITRO_NUM_PROCESSES"], env["NITRO_PROCESS_ID"]) == ("4", "2")
    assert env["NITRO_HEARTBEAT_TIMEOUT"] == "5"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["launch", "-n", "0", "train.py"],
            "nitro launch -n 0: the number of processes",
        ),
        (["launch", "-n", "2"], "nitro launch needs a script to run"),
    ],
)
def test_bad_launches_are_refused_before_any_process_starts(argv, message, capsys):
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


def _run(code: str, n: int = 2, **wait) -> tuple[int, str, str, float]:
    out, err = io.StringIO(), io.StringIO()
    start = time.monotonic()
    job = launch.Launch(["-c", code], n=n, out=out, err=err)
    status = job.wait(**wait)
    return status, out.getvalue(), err.getvalue(), time.monotonic() - start


@pytest.mark.needs_sockets
@pytest.mark.slow  # processes of their own
def test_output_comes_back_prefixed_by_rank_and_success_is_0():
    status, out, err, _ = _run(PRINTS_ITS_RANK)
    assert status == 0, err
    port = sorted(out.splitlines())[0].rsplit(":", 1)[1]
    assert sorted(out.splitlines()) == [
        f"[rank 0] 0 of 2 via 127.0.0.1:{port}",
        f"[rank 1] 1 of 2 via 127.0.0.1:{port}",
    ]


@pytest.mark.needs_sockets
@pytest.mark.slow  # processes of their own
def test_a_failed_rank_stops_the_others_and_its_status_is_returned():
    code = (
        "import os, sys, time\n"
        "if os.environ['NITRO_PROCESS_ID'] == '1': sys.exit(5)\n"
        "time.sleep(600)\n"
    )
    status, _, err, took = _run(code, n=3, grace_s=2)
    assert status == 5
    assert (
        "nitro launch: rank 1 exited with status 5; stopping rank(s) 0, 2 (SIGTERM, "
        "then SIGKILL after 2s)."
    ) in err
    assert took < 60


@pytest.mark.needs_sockets
@pytest.mark.slow  # processes of their own
def test_a_rank_that_ignores_sigterm_is_killed_after_the_grace_period():
    code = (
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "if os.environ['NITRO_PROCESS_ID'] == '0':\n"
        "    time.sleep(0.5); os.kill(os.getpid(), 9)\n"
        "time.sleep(600)\n"
    )
    status, _, err, took = _run(code, grace_s=1)
    assert status == 128 + 9
    assert "rank 0 was killed by signal 9 (SIGKILL); stopping rank(s) 1" in err
    assert took < 60


@pytest.mark.needs_sockets
@pytest.mark.slow  # processes of their own
def test_the_timeout_stops_every_rank_with_status_124():
    status, _, err, took = _run("import time; time.sleep(600)", grace_s=1, timeout_s=1)
    assert status == 124
    assert "the run did not finish within --timeout 1s; stopping every rank." in err
    assert took < 60


def test_the_cli_runs_python_on_the_script(monkeypatch):
    seen = {}

    def fake(command, **kwargs):
        seen.update(command=command, **kwargs)
        return 7

    monkeypatch.setattr(launch, "launch", fake)
    argv = ["launch", "-n", "3", "--port", "9999", "--grace", "4", "t.py", "--lr", "1"]
    assert cli.main(argv) == 7
    assert seen == {
        "command": ["t.py", "--lr", "1"],
        "n": 3,
        "port": 9999,
        "heartbeat_s": None,
        "grace_s": 4.0,
        "timeout_s": None,
    }
