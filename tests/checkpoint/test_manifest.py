"""The manifest lost or replaced: rebuilt from the records' headers with a warning,
scored by the reader's metric from the metrics the headers hold, written back by a
checkpointer before its first record and by `nitro ckpt --repair`; a manifest path
or a record name that is not a regular file is refused by name, never read (a FIFO
would block)."""

import os
import re
import shutil
import threading

import pytest
from checkpoint_fixtures import bound, write
from experiments import Tiny

import jaxnitro as nx
from jaxnitro.checkpoint.lookup import resolve_checkpoint
from jaxnitro.checkpoint.manifest import (
    MANIFEST,
    read_manifest,
    rebuild_entries,
    repair_manifest,
)
from jaxnitro.checkpoint.selectors import Last
from jaxnitro.cli import main


@pytest.fixture
def two_runs(tmp_path):
    """Run aaa with epochs 1-3, then run bbb with epoch 1; the manifest they wrote."""
    first = bound(tmp_path, run="aaa", keep=Last(3))
    for epoch in (1, 2, 3):
        write(first, epoch, 1.0 / epoch)
    write(bound(tmp_path, run="bbb", keep=Last(3)), 1, 0.25)
    return tmp_path, read_manifest(str(tmp_path))


def _rebuilt_message(directory, count):
    return (
        f"{directory / MANIFEST} is missing, but {directory} holds {count} "
        "checkpoint record(s): the manifest was rebuilt from their headers (run, "
        "epoch, step, stop_reason, checksum; the write time from the file). A header "
        "does not say which metric scored its record, so the rebuilt entries are "
        'unscored and "best" ranks none of them (`nitro ckpt --repair '
        f"{directory} --metric NAME --mode min|max` scores them). A run "
        "checkpointing here writes it back before its first record; `nitro ckpt "
        f"--repair {directory}` writes it now."
    )


def test_a_lost_manifest_is_rebuilt_from_the_records_with_a_warning(two_runs):
    directory, written = two_runs
    os.remove(directory / MANIFEST)
    with pytest.warns(
        nx.NitroWarning, match=f"^{re.escape(_rebuilt_message(directory, 4))}$"
    ):
        rebuilt = read_manifest(str(directory))
    key = lambda e: (e.file, e.run, e.epoch, e.step, e.stop_reason, e.checksum)  # noqa: E731
    assert sorted(map(key, rebuilt)) == sorted(map(key, written))
    assert all(e.score is None and e.metric is None for e in rebuilt)
    assert not (directory / MANIFEST).exists()  # a read writes nothing


def test_resume_auto_continues_from_the_records_of_a_lost_manifest(tmp_path):
    first = nx.Nitro(Tiny(max_epochs=2), run_dir=str(tmp_path), logger=None)
    first.train()
    written = read_manifest(str(tmp_path))
    os.remove(tmp_path / MANIFEST)
    with pytest.warns(nx.NitroWarning, match="manifest was rebuilt"):
        resumed = nx.Nitro(
            Tiny(max_epochs=3), run_dir=str(tmp_path), logger=None, resume="auto"
        )
    assert resumed.current_epoch == 2  # not a fresh start beside valid records
    with pytest.warns(nx.NitroWarning, match="written back before this run's first"):
        resumed.train()
    after = read_manifest(str(tmp_path))
    assert {e.epoch for e in after} == {1, 2, 3}  # epochs 1-2 stay listed
    assert {e.run for e in after} == {first.checkpoint_run}
    # Scored from the headers' metrics, so "best" still ranks the old records.
    old = {e.epoch: e.score for e in written}
    assert {e.epoch: e.score for e in after if e.epoch < 3} == pytest.approx(old)


def test_a_new_run_in_a_directory_whose_manifest_was_lost_keeps_the_old_records(
    two_runs,
):
    directory, written = two_runs
    os.remove(directory / MANIFEST)
    (directory / ".lock").write_text("1234")  # not a record: never listed
    (directory / "metrics.jsonl").write_text("{}\n")
    message = (
        f"{directory / MANIFEST} was missing beside 4 checkpoint record(s) in "
        f"{directory}: it was rebuilt from their headers and written back before "
        "this run's first record, so every record stays listed. Each is scored by "
        "the loss (min) its header's metrics hold; one whose header lacks it is "
        "unscored."
    )
    with pytest.warns(nx.NitroWarning, match=f"^{re.escape(message)}$"):
        write(bound(directory, run="ccc", keep=Last(3)), 1, 0.75)
    after = read_manifest(str(directory))
    assert sorted((e.run, e.epoch) for e in after) == sorted(
        [(e.run, e.epoch) for e in written] + [("ccc", 1)]
    )
    scores = {(e.run, e.epoch): e.score for e in after}
    assert scores == pytest.approx(
        {**{(e.run, e.epoch): e.score for e in written}, ("ccc", 1): 0.75}
    )


def test_best_after_a_lost_manifest_ranks_by_the_checkpointers_metric(two_runs):
    """A lookup through a checkpointer scores the rebuilt entries from the
    metrics their headers hold, so ("all", "best") still finds the best."""
    directory, _ = two_runs
    os.remove(directory / MANIFEST)
    with pytest.warns(nx.NitroWarning, match="scored by the loss \\(min\\)"):
        found = resolve_checkpoint(
            bound(directory, run="zzz"), str(directory), "all", "best", what="weights"
        )
    assert (found.entry.run, found.entry.epoch, found.entry.score) == ("bbb", 1, 0.25)


def test_repair_writes_the_rebuilt_manifest_scored_as_asked(two_runs, capsys):
    directory, written = two_runs
    os.remove(directory / MANIFEST)
    assert main(["ckpt", "--repair", str(directory)]) == 0
    out = capsys.readouterr().out
    assert out == (
        f"Wrote {directory / MANIFEST}: 4 checkpoint(s); runs: bbb (1 checkpoints), "
        "aaa (3 checkpoints).\n"
    )
    assert sorted(e.file for e in read_manifest(str(directory))) == sorted(
        e.file for e in written
    )
    (directory / MANIFEST).write_text("{damaged")
    assert main(["ckpt", "--repair", str(directory), "--metric", "loss"]) == 1
    assert "give both" in capsys.readouterr().err
    argv = ["ckpt", "--repair", str(directory), "--metric", "loss", "--mode", "min"]
    assert main(argv) == 0
    scores = {(e.run, e.epoch): e.score for e in read_manifest(str(directory))}
    expected = {(e.run, e.epoch): e.score for e in written}
    assert scores == pytest.approx(expected)
    capsys.readouterr()
    assert main(["ckpt", str(directory), "all", "best"]) == 0
    assert "  run: bbb\n" in capsys.readouterr().out


def test_repair_keeps_what_a_readable_manifest_says_and_drops_gone_files(two_runs):
    directory, written = two_runs
    gone = [e for e in written if e.run == "aaa" and e.epoch == 1][0]
    os.remove(directory / gone.file)
    entries, skipped = repair_manifest(str(directory))
    assert skipped == []
    assert sorted(entries, key=lambda e: e.file) == sorted(
        (e for e in written if e != gone), key=lambda e: e.file
    )


def test_repair_relists_a_file_another_record_was_copied_over(two_runs):
    directory, written = two_runs
    aaa3 = [e for e in written if e.run == "aaa" and e.epoch == 3][0]
    bbb1 = [e for e in written if e.run == "bbb"][0]
    shutil.copyfile(directory / bbb1.file, directory / aaa3.file)
    entries, _ = repair_manifest(str(directory))
    relisted = [e for e in entries if e.file == aaa3.file][0]
    assert (relisted.run, relisted.epoch, relisted.checksum) == (
        "bbb",
        1,
        bbb1.checksum,
    )


@pytest.mark.parametrize("kind", ["directory", "FIFO"])
def test_a_manifest_path_that_is_not_a_regular_file_is_refused(tmp_path, kind):
    path = tmp_path / MANIFEST
    path.mkdir() if kind == "directory" else os.mkfifo(path)
    message = (
        f"{path} is a {kind}, not a regular file: the manifest is the JSON file "
        f"manifest.json. Move the {kind} away, then `nitro ckpt --repair "
        f"{tmp_path}` rebuilds the manifest from the records beside it."
    )
    with pytest.raises(nx.CheckpointError, match=f"^{re.escape(message)}$"):
        read_manifest(str(tmp_path))
    with pytest.raises(nx.CheckpointError, match=re.escape(message)):
        repair_manifest(str(tmp_path))


def _returns_within(seconds, call, fifo):
    """Run `call` in a thread; a reader left blocked on `fifo` is released after."""
    result = []
    thread = threading.Thread(target=lambda: result.append(call()), daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():  # open() blocks on a FIFO with no writer: unblock it
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(5)
        return None
    return result[0]


def test_a_fifo_named_like_a_record_is_never_read(two_runs, capsys):
    directory, _ = two_runs
    fifo = directory / "epoch-0009-step-36-loss=0.1.safetensors"
    os.mkfifo(fifo)
    assert _returns_within(10, lambda: main(["ckpt", str(fifo)]), fifo) == 1
    assert capsys.readouterr().err == (
        f"nitro ckpt: {fifo} is a FIFO, not a regular file; a checkpoint record is "
        "a regular .safetensors file, and reading a FIFO could block or never end. "
        "Pass a record's path, or move the FIFO away.\n"
    )
    os.remove(directory / MANIFEST)
    rebuilt = _returns_within(10, lambda: rebuild_entries(str(directory)), fifo)
    assert rebuilt is not None
    entries, skipped = rebuilt
    assert len(entries) == 4 and skipped == [f"{fifo.name} (a FIFO)"]


def test_a_fresh_directory_gets_its_manifest_before_its_first_record(
    tmp_path, monkeypatch
):
    """A kill between the first record's rename and the manifest that lists it
    leaves an unlisted record beside an empty manifest: never mistaken for a lost
    manifest, so never loaded and nothing is rebuilt."""
    from jaxnitro.checkpoint import checkpointer as checkpointer_module

    real = checkpointer_module.write_manifest
    calls = []

    def killed_at_the_second(directory, entries, *args, **kwargs):
        calls.append(list(entries))
        if len(calls) == 2:
            raise KeyboardInterrupt  # the process dies here
        real(directory, entries, *args, **kwargs)

    monkeypatch.setattr(checkpointer_module, "write_manifest", killed_at_the_second)
    with pytest.raises(KeyboardInterrupt):
        write(bound(tmp_path, run="aaa"), 1, 0.5)
    assert calls[0] == [] and len(calls[1]) == 1
    assert [f for f in os.listdir(tmp_path) if f.endswith(".safetensors")] != []
    assert read_manifest(str(tmp_path)) == []  # no rebuild, no warning
