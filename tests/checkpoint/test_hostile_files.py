"""A run directory under hostile edits: a crafted manifest deletes only the records
the framework wrote; deep JSON and NUL bytes are named errors."""

import json
import os

import pytest
from checkpoint_fixtures import bound, params_at, record_files, record_header, write

import jaxnitro as nx
from jaxnitro.checkpoint.checkpointer import Checkpointer
from jaxnitro.checkpoint.manifest import MANIFEST, load_manifest
from jaxnitro.checkpoint.record import save_record
from jaxnitro.checkpoint.selectors import Last


def _craft(directory, *, pending=(), extra_entries=()):
    """Edit the manifest as an attacker would: names under pending_deletion and
    entries appended, nothing else changed."""
    path = directory / MANIFEST
    data = json.loads(path.read_text())
    data["pending_deletion"] = list(pending)
    data["entries"] += list(extra_entries)
    path.write_text(json.dumps(data))


def test_a_crafted_pending_deletion_deletes_only_records(tmp_path):
    ckpt = bound(tmp_path, keep=(Last(1),))
    write(ckpt, 1, 0.5)
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    lock = tmp_path / ".nitro.lock"
    lock.write_text("{}")
    fake = tmp_path / "weights.safetensors"  # a record's name, another's content
    fake.write_bytes(b"not a checkpoint at all")
    outside = tmp_path.parent / "outside.safetensors"
    save_record(str(outside), {"params": params_at(1.0)}, record_header())
    dropped = tmp_path / "epoch-0000-step-0.safetensors"  # a real leftover record
    save_record(str(dropped), {"params": params_at(1.0)}, record_header())
    _craft(
        tmp_path,
        pending=[
            "notes.txt",
            ".nitro.lock",
            "../outside.safetensors",
            "weights.safetensors",
            dropped.name,
        ],
    )
    with pytest.warns(nx.NitroWarning) as caught:
        resumed = bound(tmp_path, keep=(Last(1),))
        write(resumed, 2, 0.4)
    messages = "\n".join(str(w.message) for w in caught)
    for name in ("notes.txt", ".nitro.lock", "../outside.safetensors"):
        assert (
            f"lists {name!r} under pending_deletion, but that is not a name the "
            f"framework gives a checkpoint record (a filename ending in "
            f".safetensors): only the records it wrote are ever deleted, so "
            f"{name!r} is left alone." in messages
        )
    assert (
        f"{fake} is due for deletion (a rotation dropped it or the manifest lists "
        f"it under pending_deletion), but it is not a jaxnitro checkpoint record"
        in messages
    )
    assert notes.read_text() == "mine" and lock.read_text() == "{}"
    assert fake.read_bytes() == b"not a checkpoint at all"
    assert outside.exists()
    assert not dropped.exists()  # the framework's own record: deleted
    assert "weights.safetensors" not in load_manifest(str(tmp_path)).pending_deletion


def test_a_crafted_entry_that_rotation_drops_deletes_only_records(tmp_path):
    ckpt = bound(tmp_path, keep=(Last(1),))
    write(ckpt, 1, 0.5)
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    fake = tmp_path / "old.safetensors"
    fake.write_bytes(b"a user's file")
    entry = {"file": "notes.txt", "epoch": 0, "run": "r1", "written": 1.0}
    _craft(tmp_path, extra_entries=[entry, {**entry, "file": "old.safetensors"}])
    with pytest.warns(nx.NitroWarning, match="old.safetensors is due for deletion"):
        write(bound(tmp_path, keep=(Last(1),)), 2, 0.4)
    assert notes.read_text() == "mine"
    assert fake.read_bytes() == b"a user's file"
    assert len(record_files(tmp_path)) == 2  # epoch 2, and old.safetensors kept


@pytest.mark.parametrize(
    "call",
    [
        lambda d: nx.checkpoint_info(os.path.join(d, "a\x00b.safetensors")),
        lambda d: nx.load_checkpoint(
            Checkpointer(), os.path.join(d, "a\x00b.safetensors")
        ),
        lambda d: nx.read_manifest(d + "\x00"),
        lambda d: nx.runs(d + "\x00"),
    ],
)
def test_a_nul_byte_in_a_checkpoint_path_is_a_named_error(tmp_path, call):
    with pytest.raises(nx.CheckpointError, match=r"holds a NUL byte \(\\x00\) at"):
        call(str(tmp_path))


def test_a_name_hook_returning_a_nul_byte_is_refused_by_name(tmp_path):
    with pytest.raises(
        nx.ConfigError,
        match=r"The checkpointer's name function returned 'epoch-1\\x00.safetensors', "
        r"which holds a NUL byte",
    ):
        bound(tmp_path, name=lambda **kw: f"epoch-{kw['epoch']}\x00.safetensors")
    assert os.listdir(tmp_path) == []


def test_a_deeply_nested_manifest_is_a_named_error(tmp_path):
    (tmp_path / MANIFEST).write_text('{"entries": ' + "[" * 5000 + "]" * 5000 + "}")
    with pytest.raises(nx.CheckpointError, match=r"nests 5001 levels of arrays"):
        nx.read_manifest(str(tmp_path))


def test_a_lock_file_of_deep_or_huge_json_names_no_holder(tmp_path):
    from jaxnitro.checkpoint.lock import _read_holder

    lock = tmp_path / ".nitro.lock"
    lock.write_text("[" * 5000 + "]" * 5000)
    assert _read_holder(str(lock)) is None
    lock.write_text('{"pid": 7, "host": "' + "h" * 10_000 + '"}')
    assert _read_holder(str(lock)) is None
    lock.write_text('{"pid": 7, "host": "a", "since": "now"}')
    assert _read_holder(str(lock)).pid == 7
