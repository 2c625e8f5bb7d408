"""resume="auto" against a newest record that is gone or damaged: it continues the
run from the newest readable record, with a warning naming the one passed over;
a named lookup of such a record raises instead."""

import os
import re

import pytest
from checkpoint_fixtures import bound, write
from experiments import Tiny

import jaxnitro as nx
from jaxnitro.checkpoint.lookup import resolve_checkpoint, resume_latest
from jaxnitro.checkpoint.manifest import read_manifest
from jaxnitro.checkpoint.selectors import Last


@pytest.fixture
def three_epochs(tmp_path):
    """Run aaa with epochs 1-3 kept; its entries by epoch."""
    ckpt = bound(tmp_path, run="aaa", keep=Last(3))
    for epoch in (1, 2, 3):
        write(ckpt, epoch, 1.0 / epoch)
    return tmp_path, {e.epoch: e for e in read_manifest(str(tmp_path))}


def _truncate(path, by=4):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - by)


def _fell_back_message(directory, passed, epoch, file):
    return (
        f'resume="auto": the newest record of run aaa in {str(directory)!r} cannot '
        f"be resumed: {passed}. Continuing the run from the newest readable one, "
        f"epoch {epoch} ({directory / file}); the epochs after it are trained again."
    )


def test_resume_auto_steps_back_past_a_deleted_latest_record(three_epochs):
    directory, entries = three_epochs
    os.remove(directory / entries[3].file)
    passed = f"{entries[3].file} (epoch 3) is missing"
    message = _fell_back_message(directory, passed, 2, entries[2].file)
    with pytest.warns(nx.NitroWarning, match=f"^{re.escape(message)}$"):
        found = resume_latest(None, str(directory))
    assert found.entry == entries[2] and found.is_run_newest  # continues run aaa


def test_resume_auto_steps_back_past_truncated_records(three_epochs):
    directory, entries = three_epochs
    _truncate(directory / entries[3].file)
    _truncate(directory / entries[2].file)
    with pytest.warns(nx.NitroWarning) as caught:
        found = resume_latest(None, str(directory))
    assert found.entry == entries[1]
    (warning,) = caught
    text = str(warning.message)
    damaged = f"({directory / entries[3].file} is truncated or damaged"
    assert f"{entries[3].file} (epoch 3) is damaged {damaged}" in text
    assert f"{entries[2].file} (epoch 2) is damaged (" in text
    assert text.endswith(
        f"Continuing the run from the newest readable one, epoch 1 "
        f"({directory / entries[1].file}); the epochs after it are trained again."
    )


def test_resume_auto_with_no_readable_record_names_each(three_epochs):
    directory, entries = three_epochs
    for epoch in (1, 2, 3):
        os.remove(directory / entries[epoch].file)
    passed = "; ".join(f"{entries[e].file} (epoch {e}) is missing" for e in (3, 2, 1))
    message = (
        f'resume="auto": no record of run aaa in {str(directory)!r} is readable: '
        f"{passed}. Restore one, or start a fresh run (resume=False)."
    )
    with pytest.raises(nx.CheckpointError, match=f"^{re.escape(message)}$"):
        resume_latest(None, str(directory))


def test_a_named_lookup_of_a_damaged_record_raises_naming_it(three_epochs):
    directory, entries = three_epochs
    _truncate(directory / entries[3].file)
    with pytest.raises(nx.CheckpointError) as raised:
        resolve_checkpoint(None, str(directory), "aaa", "latest", what="resume")
    assert str(raised.value).startswith(
        f"resume=('aaa', 'latest'): the manifest of {str(directory)!r} lists "
        f"{entries[3].file}, but the file is damaged: {directory / entries[3].file} "
        f"is truncated or damaged"
    )


@pytest.mark.parametrize("damage", ["truncated", "deleted"])
def test_resume_auto_of_a_run_whose_latest_record_was_lost(tmp_path, damage):
    first = nx.Nitro(Tiny(max_epochs=3), run_dir=str(tmp_path), logger=None)
    first.train()
    latest = max(read_manifest(str(tmp_path)), key=lambda e: e.epoch)
    if damage == "truncated":
        _truncate(tmp_path / latest.file, by=100)
    else:
        os.remove(tmp_path / latest.file)
    said = "is damaged" if damage == "truncated" else "is missing"
    with pytest.warns(nx.NitroWarning, match=f"epoch-0003.* {said}"):
        resumed = nx.Nitro(
            Tiny(max_epochs=3), run_dir=str(tmp_path), logger=None, resume="auto"
        )
    assert resumed.current_epoch == 2
    assert resumed.checkpoint_run == first.checkpoint_run  # the same run continues
    resumed.train()
    after = {e.epoch: e for e in read_manifest(str(tmp_path))}
    assert after[3].run == first.checkpoint_run
    nx.checkpoint_info(tmp_path / after[3].file)  # the retrained epoch 3 reads
