"""Crash safety: real training processes SIGKILLed at many instants around checkpoint
writes, each time leaving a directory that loads and that resume="auto" continues.

A fork server (tests/support/crash_worker.py) imports JAX once; each trial forks a
process that resumes the run directory with resume="auto" and trains
`Tiny(max_epochs=6)`, and is killed by a fault-injection point (before or after the
n-th rename, fsync, temporary file, record write or rotation delete the checkpoint
code makes, or a torn record write) or by a timed SIGKILL. The trials run in chains on
one directory, so later kills land in resumed runs at later epochs; a chain that
completes is checked against an uninterrupted run, bit for bit, and the next trial
starts a new chain.

After every kill: the manifest loads; every entry names a record that opens and
holds that entry's epoch and run; every `.safetensors` file opens (temporary files
never carry that suffix); a file the manifest does not list is either pending
deletion (a kill during rotation) or the record of the epoch after its run's newest
entry (a kill between the record's rename and the manifest's replace); and the next
process resumes from the newest listed record of the newest run.

The whole sweep is in the slow tier (`pytest -m slow`); the default tier kills at a few
representative points, one in each window.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import experiments
import numpy as np
import pytest

from jaxnitro.checkpoint.manifest import load_manifest, read_manifest
from jaxnitro.checkpoint.record import CheckpointRecord

MAX_EPOCHS = 6
WORKER = os.path.join(os.path.dirname(experiments.__file__), "crash_worker.py")

INJECTED = (
    [f"{w}:replace:{n}" for n in range(1, 7) for w in ("before", "after")]
    + [f"{w}:fsync:{n}" for n in range(1, 9) for w in ("before", "after")]
    + [f"{w}:mkstemp:{n}" for n in (1, 2, 3) for w in ("before", "after")]
    + [f"{w}:save_file:{n}" for n in (1, 2, 3) for w in ("torn", "before")]
    + [f"{w}:remove:{n}" for n in (1, 2, 3) for w in ("before", "after")]
)
TIMED = [0.3 + 0.05 * i for i in range(10)]  # seconds after the fork
FINALIZE = [
    "before:replace:1",
    "after:replace:1",
    "before:replace:2",
    "after:replace:2",
    "after:fsync:1",
    "after:mkstemp:2",
]


class Server:
    """The fork server: one training process per `run` call."""

    def __init__(self, cache_dir: str, log_path: str) -> None:
        # On the CPU: on an accelerator this process holds the device already.
        env = {**os.environ, "JAXNITRO_COMPILATION_CACHE": cache_dir}
        env["JAX_PLATFORMS"] = "cpu"
        self.log = open(log_path, "w")  # noqa: SIM115 (closed in close())
        self.process = subprocess.Popen(
            [sys.executable, WORKER, cache_dir],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env=env,
        )
        assert self.process.stdout.readline().strip() == "ready"

    def run(self, run_dir, status, *, kill=None, delay=None, finalize=None) -> dict:
        request = {
            "run_dir": str(run_dir),
            "status": str(status),
            "kill": kill,
            "delay": delay,
            "finalize": finalize,
        }
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def log_tail(self) -> str:
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()[-3000:]

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=30)
        self.process.stdout.close()
        self.log.close()


REPRESENTATIVE = [
    "before:remove:1",  # a fresh run's first rotation, at epoch 4: pending deletion
    "after:replace:4",  # after epoch 2's manifest: the next process resumes at 2
    "before:replace:1",  # a record written but not renamed into place: a temp file
    "after:replace:1",  # renamed, not yet in the manifest: an unlisted record
    "torn:save_file:1",  # a record torn halfway through its write
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One fork server, for the default tier's few kills."""
    root = tmp_path_factory.mktemp("crash")
    started = Server(str(root / "xla-cache"), str(root / "worker.log"))
    yield started
    started.close()


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Two fork servers sharing one persistent compilation cache."""
    root = tmp_path_factory.mktemp("crash")
    started = [
        Server(str(root / "xla-cache"), str(root / f"worker{i}.log")) for i in (0, 1)
    ]
    yield started
    for server in started:
        server.close()


def newest_position(run_dir) -> tuple[str | None, int]:
    """The run resume="auto" continues and the epoch it resumes at (0: fresh)."""
    entries = read_manifest(str(run_dir))
    if not entries:
        return None, 0
    run = max(entries, key=lambda e: (e.written, e.epoch)).run
    return run, max(e.epoch for e in entries if e.run == run)


def check_directory(run_dir) -> set[str]:
    """The invariants a kill at any instant must leave (see the module).

    Returns which windows the directory shows: "unlisted" (a record renamed into
    place but not yet in the manifest), "pending" (rotation not finished), "temp".
    """
    if not os.path.isdir(run_dir):
        return set()
    manifest = load_manifest(str(run_dir))
    names = os.listdir(run_dir)
    records = {n for n in names if n.endswith(".safetensors")}
    listed = {e.file for e in manifest.entries}
    assert listed <= records, f"entries without their file: {listed - records}"
    for entry in manifest.entries:
        meta = CheckpointRecord(os.path.join(run_dir, entry.file)).meta
        assert (meta["epoch"], meta["run"]) == (entry.epoch, entry.run)
    newest: dict[str | None, int] = {}
    for entry in manifest.entries:
        newest[entry.run] = max(newest.get(entry.run, 0), entry.epoch)
    seen = set()
    for name in records - listed:
        meta = CheckpointRecord(
            os.path.join(run_dir, name)
        ).meta  # opens: never a torn file
        if name in manifest.pending_deletion:
            seen.add("pending")
        else:
            assert meta["epoch"] == newest.get(meta["run"], 0) + 1, name
            seen.add("unlisted")
    temps = [n for n in names if n.startswith(".tmp")]
    assert not [n for n in temps if n in records]
    return seen | ({"temp"} if temps else set())


def final_arrays(run_dir) -> dict[str, np.ndarray]:
    entries = read_manifest(str(run_dir))
    last = max(entries, key=lambda e: (e.epoch, e.written))
    assert last.epoch == MAX_EPOCHS
    arrays = CheckpointRecord(os.path.join(run_dir, last.file)).arrays
    return {k: v for k, v in arrays.items() if k.startswith(("params/", "opt_state/"))}


class Chains:
    """Trials in chains on one server: each trial resumes the chain's directory."""

    def __init__(self, server: Server, root, reference: dict, finalizing: list):
        self.server, self.root, self.reference = server, root, reference
        root.mkdir()
        self.finalizing = finalizing
        self.chain = self.chains = self.kills = self.processes = 0
        self.missed: list[dict] = []
        self.seen: set[str] = set()

    @property
    def run_dir(self):
        return self.root / f"chain{self.chain}"

    def trial(self, **kw) -> dict:
        self.processes += 1
        status = self.root / f"status{self.processes}.json"
        expected = newest_position(self.run_dir)
        outcome = self.server.run(self.run_dir, status, **kw)
        if status.exists():  # the process got past setup: it resumed where it should
            began = json.loads(status.read_text())
            assert began["start"] == expected[1], (kw, began, expected)
            if expected[0] is not None:
                assert began["run"] == expected[0], (kw, began, expected)
        assert outcome in ({"signal": signal.SIGKILL}, {"exit": 0}), (
            kw,
            outcome,
            self.server.log_tail(),
        )
        self.kills += outcome == {"signal": signal.SIGKILL}
        if outcome != {"signal": signal.SIGKILL} and kw:
            self.missed.append(kw)
        self.seen |= check_directory(self.run_dir)
        return outcome

    def finish(self) -> None:
        """Complete the chain's run and compare it with the uninterrupted one."""
        if self.finalizing and newest_position(self.run_dir)[1] < MAX_EPOCHS:
            # Train to the end, then die inside finalize's stop_reason rewrite.
            self.trial(kill=self.finalizing.pop(), finalize="error")
        if newest_position(self.run_dir)[1] < MAX_EPOCHS:
            assert self.trial() == {"exit": 0}
        finished = final_arrays(self.run_dir)
        assert finished.keys() == self.reference.keys()
        for key, value in self.reference.items():
            np.testing.assert_array_equal(finished[key], value, err_msg=key)
        self.chain += 1
        self.chains += 1

    def run(self, trials: list[dict]) -> Chains:
        for kw in trials:
            self.trial(**kw)
            position = newest_position(self.run_dir)[1]
            if position == MAX_EPOCHS or (
                self.finalizing and position >= MAX_EPOCHS - 2
            ):
                self.finish()
        self.finish()
        return self


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the fork server needs os.fork")
def test_sigkill_at_representative_points_leaves_a_resumable_directory(
    server, tmp_path
):
    """One kill in each window (pending, temp, unlisted), a torn write, a kill in a
    resumed run and one inside finalize's rewrite: every directory loads, every
    process resumes where it should, and both chains end equal to the uninterrupted
    run, bit for bit."""
    assert server.run(tmp_path / "reference", tmp_path / "ref.json") == {"exit": 0}
    reference = final_arrays(tmp_path / "reference")
    chains = Chains(server, tmp_path / "s", reference, ["after:replace:1"])
    chains.run([{"kill": k} for k in REPRESENTATIVE])
    assert chains.missed == [] and chains.kills == len(REPRESENTATIVE) + 1
    assert chains.chains == 2
    assert chains.seen == {"unlisted", "pending", "temp"}


@pytest.mark.slow  # about 70 training processes
@pytest.mark.skipif(not hasattr(os, "fork"), reason="the fork server needs os.fork")
def test_sigkill_around_checkpoint_writes_always_leaves_a_resumable_directory(
    servers, tmp_path
):
    started = time.monotonic()
    first = servers[0]
    assert first.run(tmp_path / "reference", tmp_path / "ref.json") == {"exit": 0}
    reference = final_arrays(tmp_path / "reference")
    trials = [{"kill": k} for k in INJECTED] + [{"delay": d} for d in TIMED]
    halves = [trials[0::2], trials[1::2]]
    with ThreadPoolExecutor(len(servers)) as pool:
        futures = [
            pool.submit(
                Chains(server, tmp_path / f"s{i}", reference, FINALIZE[i::2]).run,
                halves[i],
            )
            for i, server in enumerate(servers)
        ]
        done = [f.result() for f in futures]
    kills = sum(c.kills for c in done)
    elapsed = time.monotonic() - started
    print(
        f"{kills} kills over {sum(c.processes for c in done)} processes in "
        f"{sum(c.chains for c in done)} chains, {elapsed:.1f} s; no kill: "
        f"{[c.missed for c in done]}"
    )
    assert kills >= 50
    assert set().union(*(c.seen for c in done)) == {"unlisted", "pending", "temp"}
