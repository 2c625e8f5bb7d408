"""Checkpoint files: damaged and foreign files, header-only reads, tree mismatches and
the manifest's own errors."""

import builtins
import errno
import json
import os
import pickle
import struct

import numpy as np
import pytest
from checkpoint_fixtures import params_at, record_header
from safetensors.numpy import save_file

import jaxnitro as nx
from jaxnitro.checkpoint import record as record_module
from jaxnitro.checkpoint.info import checkpoint_info
from jaxnitro.checkpoint.manifest import MANIFEST, read_manifest
from jaxnitro.checkpoint.modes import process_umask
from jaxnitro.checkpoint.record import CheckpointRecord, read_header, save_record


@pytest.fixture
def good(tmp_path):
    path = tmp_path / "good.safetensors"
    save_record(str(path), {"params": params_at(2.0)}, record_header(epoch=3, step=12))
    return path


def readers():
    return [CheckpointRecord, read_header, checkpoint_info]


# ----------------------------------------------------------------- bad files -----
def _truncated_short(tmp_path, good):
    path = tmp_path / "short.safetensors"
    path.write_bytes(good.read_bytes()[:5])
    return path, "is truncated: 5 bytes, shorter than the 8-byte length"


def _truncated_data(tmp_path, good):
    path = tmp_path / "cut.safetensors"
    path.write_bytes(good.read_bytes()[:-7])
    return path, "is truncated or damaged: its header describes"


def _truncated_header(tmp_path, good):
    path = tmp_path / "cuthead.safetensors"
    path.write_bytes(good.read_bytes()[:40])
    return path, "announce a \\d+-byte header but the file holds 40 bytes"


def _corrupted_header(tmp_path, good):
    data = bytearray(good.read_bytes())
    data[8:20] = b"#" * 12
    path = tmp_path / "garbled.safetensors"
    path.write_bytes(bytes(data))
    return path, "has a corrupted header: it is not valid JSON"


def _corrupted_meta(tmp_path, good):
    path = tmp_path / "meta.safetensors"
    save_file({"a": np.zeros(2, np.float32)}, str(path), metadata={"jaxnitro": "{x"})
    return path, "has corrupted record metadata: the 'jaxnitro' header entry"


def _foreign_safetensors(tmp_path, good):
    path = tmp_path / "foreign.safetensors"
    save_file({"a": np.zeros(2, np.float32)}, str(path), metadata={"format": "pt"})
    return path, "is a safetensors file but not a jaxnitro record"


def _not_safetensors(tmp_path, good):
    path = tmp_path / "notes.safetensors"
    path.write_text("these are my training notes, not a checkpoint at all\n" * 3)
    return path, "is not a readable safetensors file: its first 8 bytes announce"


def _future_format(tmp_path, good):
    path = tmp_path / "future.safetensors"
    save_file(
        {"a": np.zeros(2, np.float32)},
        str(path),
        metadata={"jaxnitro": json.dumps({"format_version": 99})},
    )
    return path, "has record format 99; this jaxnitro reads format 1"


def _json_array_header(tmp_path, good):
    text = b"[1, 2, 3]     "
    path = tmp_path / "array.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text)
    return path, "has a corrupted header: a JSON list"


def _bad_offsets(tmp_path, good):
    text = json.dumps({"a": {"dtype": "F32", "shape": [2]}}).encode()
    path = tmp_path / "offsets.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text)
    return path, "tensor 'a' has no valid data_offsets"


def _bad_metadata_field(tmp_path, good):
    text = json.dumps({"__metadata__": [1]}).encode()
    path = tmp_path / "metadata.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text)
    return path, "has a corrupted header: bad __metadata__"


def _meta_not_an_object(tmp_path, good):
    path = tmp_path / "metalist.safetensors"
    save_file({"a": np.zeros(2, np.float32)}, str(path), metadata={"jaxnitro": "[1]"})
    return path, "has corrupted record metadata: a JSON list, not an object"


def _deep_header(tmp_path, good):
    """A safetensors header nested 5000 levels: Python's parser would raise
    RecursionError."""
    text = b'{"x": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    path = tmp_path / "deep.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text)
    return path, (
        "has a corrupted header: it is not valid JSON \\(it nests 5001 levels of "
        "arrays and objects; at most 64 are accepted"
    )


def _deep_meta(tmp_path, good):
    path = tmp_path / "deepmeta.safetensors"
    deep = '{"config": ' + "[" * 5000 + "]" * 5000 + "}"
    save_file({"a": np.zeros(2, np.float32)}, str(path), metadata={"jaxnitro": deep})
    return path, (
        "has corrupted record metadata: the 'jaxnitro' header entry is not valid "
        "JSON \\(it nests 5001 levels"
    )


def _huge_integer_meta(tmp_path, good):
    path = tmp_path / "digits.safetensors"
    meta = '{"epoch": ' + "9" * 5000 + "}"
    save_file({"a": np.zeros(2, np.float32)}, str(path), metadata={"jaxnitro": meta})
    return path, "header entry is not valid JSON \\(Exceeds the limit"


@pytest.mark.parametrize(
    "make",
    [
        _deep_header,
        _deep_meta,
        _huge_integer_meta,
        _bad_metadata_field,
        _meta_not_an_object,
        _truncated_short,
        _truncated_data,
        _truncated_header,
        _corrupted_header,
        _corrupted_meta,
        _foreign_safetensors,
        _not_safetensors,
        _future_format,
        _json_array_header,
        _bad_offsets,
    ],
)
@pytest.mark.parametrize("reader", readers())
def test_a_bad_file_raises_naming_the_file_and_what_is_wrong(
    tmp_path, good, make, reader
):
    path, message = make(tmp_path, good)
    with pytest.raises(nx.CheckpointError, match=message) as caught:
        reader(str(path))
    assert str(path) in str(caught.value)


@pytest.mark.parametrize("reader", readers())
def test_a_missing_file_or_a_directory_raises(tmp_path, reader):
    with pytest.raises(nx.CheckpointError, match="No checkpoint at .*nowhere"):
        reader(str(tmp_path / "nowhere.safetensors"))
    with pytest.raises(nx.CheckpointError, match="is a directory, not a checkpoint"):
        reader(str(tmp_path))


def test_an_unreadable_file_raises_naming_it(good, monkeypatch):
    def denied(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(record_module, "open", denied, raising=False)
    with pytest.raises(nx.CheckpointError, match="good.safetensors cannot be read: "):
        read_header(str(good))
    monkeypatch.undo()
    for error, message in [
        (PermissionError(errno.EACCES, "denied"), "cannot be read: .*denied"),
        (FileNotFoundError(errno.ENOENT, "gone"), "No checkpoint at"),
    ]:

        def failing(path, error=error):
            raise error

        monkeypatch.setattr(record_module, "load_file", failing)
        with pytest.raises(nx.CheckpointError, match=message):
            CheckpointRecord(str(good))


def test_damaged_tensor_data_the_header_cannot_see_raises_naming_the_file(tmp_path):
    path = tmp_path / "dtype.safetensors"
    meta = json.dumps(record_header().to_json())
    header = {
        "__metadata__": {"jaxnitro": meta},
        "a": {"dtype": "NOPE", "shape": [2], "data_offsets": [0, 8]},
    }
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"\0" * 8)
    assert read_header(str(path)).format_version == 1
    with pytest.raises(nx.CheckpointError, match="its arrays cannot be read"):
        CheckpointRecord(str(path))


class _Exploit:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_a_record_never_executes_code_when_loaded(tmp_path):
    path = tmp_path / "epoch-0001-step-4.safetensors"
    path.write_bytes(pickle.dumps(_Exploit()))
    for reader in readers():
        with pytest.raises(nx.CheckpointError, match=str(path)):
            reader(str(path))
    assert not (tmp_path / "pwned").exists()


def test_checkpoint_info_reads_the_header_only(tmp_path, good, monkeypatch):
    read = []
    real_open = builtins.open

    class Counting:
        def __init__(self, f):
            self.f = f

        def read(self, n=-1):
            data = self.f.read(n)
            read.append(len(data))
            return data

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(
        record_module,
        "open",
        lambda *a, **k: Counting(real_open(*a, **k)),
        raising=False,
    )
    info = checkpoint_info(good)
    (length,) = struct.unpack("<Q", good.read_bytes()[:8])
    assert info["epoch"] == 3
    assert sum(read) == 8 + length < good.stat().st_size


def test_checkpoint_info_of_a_huge_sparse_record_reads_no_tensor_data(tmp_path):
    size = 2**40  # a 1 TiB tensor, as a sparse file: reading it would never finish
    meta = json.dumps(record_header(epoch=7).to_json())
    header = {
        "__metadata__": {"jaxnitro": meta},
        "params/['w']": {"dtype": "U8", "shape": [size], "data_offsets": [0, size]},
    }
    text = json.dumps(header).encode()
    path = tmp_path / "huge.safetensors"
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        f.truncate(8 + len(text) + size)
    assert checkpoint_info(path)["epoch"] == 7


# ------------------------------------------------------------- tree mismatch -----
def test_a_tree_mismatch_names_the_first_leaves_by_key_path_with_both_shapes(good):
    record = CheckpointRecord(str(good))
    wider = {"w": np.zeros((2, 5), np.float32), "b": np.zeros(3, np.float32)}
    with pytest.raises(
        nx.CheckpointError,
        match="its parameter tree does not fit .*: \\['w'\\] is float32\\[2, 3\\] in "
        "the record but float32\\[2, 5\\] in this model\\. The record was written",
    ):
        record.restore("params", wider, "parameter")
    renamed = {"w": np.zeros((2, 3), np.float32), "bias": np.zeros(3, np.float32)}
    with pytest.raises(
        nx.CheckpointError,
        match="\\['bias'\\] is missing from the record \\(this model has "
        "float32\\[3\\]\\); \\['b'\\] \\(float32\\[3\\]\\) is in the record but not",
    ):
        record.restore("params", renamed, "parameter")
    many = {f"x{i}": np.zeros(1, np.float32) for i in range(4)}
    with pytest.raises(nx.CheckpointError, match="\\(6 mismatching leaves in all\\)"):
        record.restore("params", many, "parameter")
    cast = {"w": np.zeros((2, 3), np.float64), "b": np.zeros(3, np.float32)}
    with pytest.raises(
        nx.CheckpointError, match="float32\\[2, 3\\] in the record but "
    ):
        record.restore("params", cast, "parameter")


# ------------------------------------------------------------------ manifest -----
@pytest.mark.parametrize(
    "text, message",
    [
        ("{not json", "manifest.json is not valid JSON"),
        ("[1, 2]", "is not a jaxnitro manifest: expected an object"),
        ('{"entries": [{"epoch": 1}]}', "entry 0 is .*needs a `file`"),
        ('{"entries": [{"file": "../x", "epoch": 1}]}', "entry 0 is .*a basename"),
        ('{"entries": [], "pending_deletion": [3]}', "pending_deletion must be a list"),
    ],
)
def test_a_damaged_manifest_raises_naming_it(tmp_path, text, message):
    (tmp_path / MANIFEST).write_text(text)
    with pytest.raises(nx.CheckpointError, match=message) as caught:
        read_manifest(str(tmp_path))
    assert str(tmp_path / MANIFEST) in str(caught.value)


@pytest.mark.parametrize("proc", [True, False], ids=["proc", "no-proc"])
def test_process_umask_reads_the_umask_without_changing_it(monkeypatch, proc):
    real_open = builtins.open

    def no_proc(path, *args, **kwargs):
        if path == "/proc/self/status":
            raise FileNotFoundError(path)
        return real_open(path, *args, **kwargs)

    if not proc:
        monkeypatch.setattr(builtins, "open", no_proc)
    previous = os.umask(0o037)
    try:
        assert process_umask() == 0o037
        assert os.umask(0o037) == 0o037  # left as it was
    finally:
        os.umask(previous)


def filling_then_failing(error):
    """A `save_file` that writes part of the file, then fails with `error`, as a
    write that runs out of disk does."""

    def save(tensors, path, metadata=None):
        with open(path, "wb") as f:
            f.write(b"\0" * 100)
        raise error

    return save


@pytest.mark.parametrize(
    "error, reason",
    [
        (
            # What safetensors raises on a full disk: its own error, not an OSError.
            record_module.SafetensorError(
                "Error while serializing: I/O error: No space left on device "
                "(os error 28)"
            ),
            "No space left on device",
        ),
        (OSError(errno.EFBIG, "File too large"), "File too large"),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), "Disk quota exceeded"),
    ],
)
def test_a_write_without_room_names_the_path_the_bytes_and_the_free_space(
    tmp_path, monkeypatch, error, reason
):
    path = str(tmp_path / "epoch-0001.safetensors")
    monkeypatch.setattr(record_module, "save_file", filling_then_failing(error))
    params = {"w": np.zeros((256, 4), np.float32)}  # 4096 bytes of arrays
    with pytest.raises(nx.CheckpointError) as caught:
        save_record(path, {"params": params}, record_header(epoch=1, step=4))
    text = str(caught.value)
    assert text.startswith(f"Cannot write the checkpoint {path}: {reason}.")
    needed = int(text.split("needs about ")[1].split(" bytes")[0].replace(",", ""))
    assert 4096 + 8 < needed < 4096 + 8 + 2000  # the arrays and the header
    assert "bytes (" in text.split("has ")[1] and "free" in text
    assert "Free space on that disk" in text and "then resume" in text
    assert os.listdir(tmp_path) == []  # the partial temporary file is gone


def test_another_write_error_is_not_taken_for_a_full_disk(tmp_path, monkeypatch):
    denied = PermissionError(errno.EACCES, "Permission denied")
    monkeypatch.setattr(record_module, "save_file", filling_then_failing(denied))
    with pytest.raises(PermissionError):
        save_record(
            str(tmp_path / "r.safetensors"),
            {"params": params_at(1.0)},
            record_header(epoch=1, step=1),
        )
    assert os.listdir(tmp_path) == []


def test_a_header_rewrite_without_room_leaves_the_record_as_it_was(good, monkeypatch):
    before = good.read_bytes()

    def full(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(record_module.shutil, "copyfileobj", full)
    with pytest.raises(
        nx.CheckpointError,
        match=rf"Cannot write the checkpoint {good}: No space left on device\. The "
        r"record needs about [\d,]+ bytes",
    ):
        record_module.rewrite_header(str(good), lambda h: h)
    assert good.read_bytes() == before
    assert os.listdir(good.parent) == [good.name]
