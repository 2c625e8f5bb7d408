"""Evaluation and checkpoints across processes: each process's real rows joined
rank by rank, a chunk the processes cut differently refused on every rank, and (in
processes of their own) validation, evaluate, predict and an fsdp run across 2
processes equal to one process, every rank scoring the same metrics."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from process_jobs import child_env

import jaxnitro as nx
from jaxnitro.devices import gather

SUPPORT = Path(__file__).parents[1] / "support"
SRC = Path(nx.__file__).parents[1]
WORKER = str(SUPPORT / "dist_eval_worker.py")


def test_the_real_rows_are_each_process_part_without_its_padding():
    # Two processes' parts of width 4: rank 0 holds 2 real rows, rank 1 holds 3.
    whole = np.array([0, 1, 1, 1, 4, 5, 6, 6])
    assert gather._real_rows(whole, np.array([2, 3])).tolist() == [0, 1, 4, 5, 6]


def test_one_process_counts_its_chunk_and_refuses_an_empty_one():
    shared = gather.chunk_counts(3, True, split="val", index=0, width=4)
    assert (shared.counts.tolist(), shared.stop) == ([3], False)
    assert gather.chunk_counts(3, True, split="val", index=0, width=4, stop=True).stop
    with pytest.raises(
        nx.ConfigError,
        match=r"Batch 2 of split `val`: rank 0 feeds 0 of its rows \(counts by rank: "
        r"\[0\]\)",
    ):
        gather.chunk_counts(0, True, split="val", index=2, width=4)


def test_shard_keeping_the_last_batch_gives_every_row_once():
    rows = np.arange(20)
    parts = [
        nx.Distributed(r, 2, (), (), None).shard(rows, 8, drop_last=False)
        for r in range(2)
    ]
    assert parts[0].tolist() == [0, 1, 2, 3, 8, 9, 10, 11, 16, 17]
    assert parts[1].tolist() == [4, 5, 6, 7, 12, 13, 14, 15, 18, 19]


def test_one_process_leaves_a_training_state_as_it_is():
    tree = {"w": np.ones((2, 3))}
    assert gather.gather_split_leaves(tree) is tree


def _run(args: list[str], *, devices: int, processes: int = 1):
    """The worker in one plain process, or under `nitro launch -n processes`."""
    if processes == 1:
        command = [sys.executable, WORKER, *args]
    else:
        launch = ["-m", "jaxnitro.cli", "launch", "-n", str(processes)]
        command = [sys.executable, *launch, "--timeout", "200", WORKER, *args]
    result = subprocess.run(
        command, env=child_env(devices), capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def _seen(out: Path, rank: int) -> dict:
    seen = json.loads((out / f"rank{rank}.json").read_text())
    for row in seen["history"]:
        row.pop("seconds")  # wall time: the one column that differs
    return seen


def _record(run_dir: Path, epoch: int) -> dict:
    (path,) = run_dir.glob(f"epoch-{epoch:04d}-*.safetensors")
    return nx.Checkpointer().load(str(path)).arrays


def _assert_close(expected, got):
    """Nested dicts, lists and numbers equal within float32 rounding."""
    if isinstance(expected, dict):
        assert sorted(got) == sorted(expected)
        for key in expected:
            _assert_close(expected[key], got[key])
    elif isinstance(expected, list) and expected and isinstance(expected[0], dict):
        assert len(got) == len(expected)
        for want, have in zip(expected, got, strict=True):
            _assert_close(want, have)
    else:
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.needs_sockets
@pytest.mark.slow  # processes of their own
def test_two_processes_validate_evaluate_and_predict_as_one_process(tmp_path):
    _run([str(tmp_path / "one"), str(tmp_path / "out1")], devices=1)
    two = _run([str(tmp_path / "two"), str(tmp_path / "out2")], devices=1, processes=2)
    alone, ranks = (
        _seen(tmp_path / "out1", 0),
        [_seen(tmp_path / "out2", r) for r in range(2)],
    )
    # Every rank saw exactly the same metrics: early stopping and the checkpoint
    # ranking decide alike, so both stopped after epoch 2 of 4.
    assert ranks[0] == ranks[1]
    assert [seen["epoch"] for seen in (alone, *ranks)] == [2, 2, 2]
    assert "[rank 1] rank 1 of 2 stopped at epoch 2" in two.stdout
    # And they are one process's: the val split's short last batch (4 of 8 rows,
    # 2 from each process, each padded to its part of the width) scored exactly.
    assert len(alone["history"]) == 2
    _assert_close(alone["history"], ranks[0]["history"])
    assert alone["test"]["confusion"] == ranks[0]["test"]["confusion"]
    _assert_close(alone["test"], ranks[0]["test"])
    assert np.shape(ranks[0]["predict"]) == (10, 3)  # every rank: the whole batch
    _assert_close(alone["predict"], ranks[0]["predict"])
    _assert_close(_record(tmp_path / "one", 2), _record(tmp_path / "two", 2))
    lines = [(tmp_path / run / "metrics.jsonl").read_text() for run in ("one", "two")]
    assert lines[0].count("\n") == lines[1].count("\n")


@pytest.mark.needs_sockets
@pytest.mark.slow  # processes of their own
def test_fsdp_across_two_processes_writes_whole_leaves_and_resumes_in_one(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    _run([str(one), str(tmp_path / "out1"), "4", "fsdp"], devices=4)
    # A mesh of 4 devices, 2 of each process: w1 and its moments split over both.
    _run([str(two), str(tmp_path / "out2"), "2", "fsdp"], devices=2, processes=2)
    _assert_close(_seen(tmp_path / "out1", 0), _seen(tmp_path / "out2", 1))
    written = _record(two, 2)
    assert written["params/['w1']"].shape == (8, 128)  # whole, not rank 0's part
    _assert_close(_record(one, 2), written)
    # One process resumes the record the two wrote, and goes on as one process.
    for run_dir in (one, two):
        _run([str(run_dir), str(tmp_path / "out"), "4", "fsdp", "5"], devices=4)
    _assert_close(_record(one, 5), _record(two, 5))
