"""A listed file that is not the record the manifest lists: gone, damaged, or another
run's record copied over its name (refused by name: resuming it would continue the
wrong lineage)."""

import os
import re
import shutil

import pytest
from checkpoint_fixtures import bound, write
from experiments import Tiny

import jaxnitro as nx
from jaxnitro.checkpoint.integrity import entry_problem
from jaxnitro.checkpoint.manifest import read_manifest
from jaxnitro.checkpoint.record import read_header_checksummed
from jaxnitro.checkpoint.selectors import Last


def _replaced_message(directory, listed, held):
    path = directory / listed.file
    return (
        f"{path} is not the record the manifest of {directory} lists under that "
        f"name: the manifest lists run {listed.run}, epoch {listed.epoch}, step "
        f"{listed.step}, checksum {listed.checksum}, but the file holds run "
        f"{held.run}, epoch {held.epoch}, step {held.step}, checksum {held.checksum}."
        f" Another record was copied over it. Put the listed record back, or move "
        f"the file away and run `nitro ckpt --repair {directory}` to list what the "
        f"directory holds now."
    )


def test_another_runs_record_copied_over_the_latest_is_refused_at_setup(tmp_path):
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    nx.Nitro(Tiny(max_epochs=2), run_dir=str(mine), logger=None).train()
    nx.Nitro(Tiny(max_epochs=1), run_dir=str(theirs), logger=None).train()
    latest = max(read_manifest(str(mine)), key=lambda e: e.epoch)
    (other,) = read_manifest(str(theirs))
    shutil.copyfile(theirs / other.file, mine / latest.file)
    message = _replaced_message(mine, latest, other)
    with pytest.raises(nx.CheckpointError, match=f"^{re.escape(message)}$"):
        nx.Nitro(Tiny(max_epochs=3), run_dir=str(mine), logger=None, resume="auto")
    with pytest.raises(nx.CheckpointError, match=re.escape(message)):
        nx.Nitro(Tiny(), run_dir=str(mine), logger=None, weights=("latest", "latest"))


def test_the_manifest_records_each_files_checksum_which_finalize_keeps(tmp_path):
    ckpt = bound(tmp_path, run="aaa", keep=Last(2))
    write(ckpt, 1, 0.5)
    write(ckpt, 2, 0.4)
    assert ckpt.finalize("completed")
    for entry in read_manifest(str(tmp_path)):
        header, checksum = read_header_checksummed(str(tmp_path / entry.file))
        assert (entry.run, entry.step) == (header.run, header.step)
        assert entry.checksum == checksum
        assert entry_problem(str(tmp_path), entry) is None


def test_an_entry_problem_names_a_missing_a_damaged_and_a_replaced_file(tmp_path):
    ckpt = bound(tmp_path, run="aaa", keep=Last(3))
    for epoch in (1, 2, 3):
        write(ckpt, epoch, 1.0 / epoch)
    one, two, three = sorted(read_manifest(str(tmp_path)), key=lambda e: e.epoch)
    os.remove(tmp_path / one.file)
    with open(tmp_path / two.file, "r+b") as f:
        f.truncate(os.path.getsize(tmp_path / two.file) - 4)
    write(bound(tmp_path / "other", run="bbb", keep=Last(1)), 3, 0.1)
    (theirs,) = read_manifest(str(tmp_path / "other"))
    shutil.copyfile(tmp_path / "other" / theirs.file, tmp_path / three.file)
    problems = [entry_problem(str(tmp_path), e) for e in (one, two, three)]
    assert [p.kind for p in problems] == ["missing", "damaged", "replaced"]
    assert problems[0].detail == f"{tmp_path / one.file} is missing"
    assert "is truncated or damaged" in problems[1].detail
    assert problems[2].detail == _replaced_message(tmp_path, three, theirs)
