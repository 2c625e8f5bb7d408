"""The JSON-lines loader: records into arrays, E-LOAD errors, the seeded stream."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from jaxnitro.runfile.records import read_records
from jaxnitro.runfile.source import RunfileError
from jaxnitro.runfile.stdlib_data import FieldSpec, FilesSpec, LoaderSpec
from jaxnitro.runfile.streams import RecordStream, TrainBlocks, eval_batches


def loader(name: str, encoding: str = "jsonl", shape=(3,), dtype="int32"):
    field = FieldSpec("tokens", "ids", dtype, shape)
    return LoaderSpec((FilesSpec((name,), encoding),), (field,), 2, True)


def write(tmp_path, name, records, gz=False):
    text = "".join(
        (r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records
    ).encode()
    path = tmp_path / name
    path.write_bytes(gzip.compress(text) if gz else text)


def test_reads_plain_and_gzip_records_into_arrays(tmp_path):
    rows = [{"ids": [i, i + 1, i + 2]} for i in range(5)]
    write(tmp_path, "a.jsonl", rows)
    write(tmp_path, "a.jsonl.gz", rows, gz=True)
    plain = read_records(loader("a.jsonl"), str(tmp_path))
    packed = read_records(loader("a.jsonl.gz", "jsonl.gz"), str(tmp_path))
    assert plain.arrays["tokens"].dtype == np.int32
    assert plain.arrays["tokens"].shape == (5, 3)
    np.testing.assert_array_equal(plain.arrays["tokens"], packed.arrays["tokens"])
    assert plain.where[4] == "a.jsonl:5"


@pytest.mark.parametrize(
    ("bad", "code", "words"),
    [
        ({"input": [1, 2, 3]}, "E-LOAD-009", "reads key 'ids'"),
        ({"ids": ["a", "b", "c"]}, "E-LOAD-010", "not :i32"),
        ({"ids": [1.5, 2, 3]}, "E-LOAD-010", "float64 values"),
        ({"ids": [1, 2]}, "E-LOAD-011", "has shape [2], but the loader declares [3]"),
        ("{not json", "E-LOAD-010", "not a JSON record"),
    ],
)
def test_a_bad_first_record_is_refused_naming_file_line_and_field(
    tmp_path, bad, code, words
):
    write(tmp_path, "d.jsonl", [bad, {"ids": [1, 2, 3]}])
    with pytest.raises(RunfileError) as caught:
        read_records(loader("d.jsonl"), str(tmp_path))
    assert caught.value.codes == [code]
    assert "d.jsonl:1" in str(caught.value) and words in str(caught.value)


def test_a_later_bad_record_is_refused_at_its_batch(tmp_path):
    rows = [{"ids": [1, 2, 3]}] * 4 + [{"ids": [1, 2]}]
    write(tmp_path, "d.jsonl", rows)
    records = read_records(loader("d.jsonl"), str(tmp_path))
    batches = eval_batches(records, 2, limit=2)  # rows 0-3 only: fine
    assert len(batches) == 2
    with pytest.raises(RunfileError, match=r"d.jsonl:5: field :tokens") as caught:
        eval_batches(records, 2, limit=None)
    assert caught.value.codes == ["E-LOAD-011"]


def test_a_missing_file_or_an_empty_one_is_refused(tmp_path):
    with pytest.raises(RunfileError, match="no data file") as caught:
        read_records(loader("gone.jsonl"), str(tmp_path))
    assert caught.value.codes == ["E-LOAD-008"]
    write(tmp_path, "empty.jsonl", [])
    with pytest.raises(RunfileError, match="hold no records"):
        read_records(loader("empty.jsonl"), str(tmp_path))


def test_the_stream_is_seeded_covers_each_pass_and_blocks_resume_exactly(tmp_path):
    write(tmp_path, "s.jsonl", [{"ids": [i, 0, 0]} for i in range(6)])
    records = read_records(loader("s.jsonl"), str(tmp_path))
    stream = RecordStream(records, seed=1)
    first = stream.rows(0, 12)
    assert sorted(first[:6].tolist()) == list(range(6))  # each pass is a permutation
    assert sorted(first[6:].tolist()) == list(range(6))
    np.testing.assert_array_equal(first, RecordStream(records, seed=1).rows(0, 12))
    assert not np.array_equal(first, RecordStream(records, seed=2).rows(0, 12))

    blocks = (4, 4, 2)  # batches per epoch, the last block shorter
    run = TrainBlocks(RecordStream(records, seed=1), 2, blocks)
    seen = [np.concatenate([b["tokens"][:, 0] for b in run]) for _ in blocks]
    assert [len(s) for s in seen] == [8, 8, 4]
    np.testing.assert_array_equal(
        np.concatenate(seen),
        records.arrays["tokens"][RecordStream(records, seed=1).rows(0, 20), 0],
    )
    resumed = TrainBlocks(RecordStream(records, seed=1), 2, blocks)
    resumed.set_epoch(2)
    plan = resumed.begin_epoch()
    assert len(resumed) == 2
    again = np.concatenate(
        [resumed.batch_at(i, plan)["tokens"][:, 0] for i in range(2)]
    )
    np.testing.assert_array_equal(again, seen[2])


def test_the_example_data_generator_writes_the_shipped_files_again(tmp_path):
    import importlib.util
    from pathlib import Path

    examples = Path(__file__).parents[2] / "examples" / "runfiles"
    spec = importlib.util.spec_from_file_location(
        "make_data", examples / "make_data.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    written = module.main(str(tmp_path))
    assert [Path(p).name for p in written] == [
        "tiny-train.jsonl.gz",
        "train.jsonl.gz",
        "valid.jsonl.gz",
    ]
    for path in written:
        shipped = examples / "data" / Path(path).name
        assert Path(path).read_bytes() == shipped.read_bytes()
