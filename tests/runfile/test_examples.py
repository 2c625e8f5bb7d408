"""The shipped examples: their data is what make_data.py writes, byte for byte, and
realistic.sx's default variant checks and reads the data `--full` writes."""

from __future__ import annotations

import filecmp
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jaxnitro.runfile.check import check_file
from jaxnitro.runfile.evaluator import evaluate_file
from jaxnitro.runfile.knobs import Selection

EXAMPLES = Path(__file__).parents[2] / "examples" / "runfiles"


def make_data(folder: Path, *args: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "make_data.py"), str(folder), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout.split()


def test_make_data_writes_the_same_bytes_twice_and_the_shipped_files(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "make_data", EXAMPLES / "make_data.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    first = module.main(str(tmp_path / "a"))
    second = module.main(str(tmp_path / "b"))
    names = ["tiny-train.jsonl.gz", "train.jsonl.gz", "valid.jsonl.gz"]
    assert [os.path.basename(p) for p in first] == names
    for a, b in zip(first, second, strict=True):
        assert Path(a).read_bytes() == Path(b).read_bytes()
        assert Path(a).read_bytes() == (EXAMPLES / "data" / Path(a).name).read_bytes()
    assert not list((tmp_path / "a" / "data").glob("*.partial"))
    with gzip.open(first[0], "rt") as lines:
        records = [json.loads(line)["input_ids"] for line in lines]
    assert len(records) == 256 and {len(r) for r in records} == {17}
    assert max(max(r) for r in records) < 32


def test_realistic_reads_the_shipped_data_at_seq_64_and_data_full_otherwise():
    path = str(EXAMPLES / "realistic.sx")
    files = {
        variant: evaluate_file(path, Selection(variant=variant))
        .value("train-loader")
        .sources[0]
        .paths
        for variant in (None, "small", "smoke")
    }
    assert files == {
        None: ("data/full/train.jsonl.gz",),
        "small": ("data/full/train.jsonl.gz",),
        "smoke": ("data/train.jsonl.gz",),
    }
    report = check_file(path)  # check opens no data file: the default checks
    assert report.parameters == 4 + 14 * 4 and report.steps == 2000


@pytest.mark.slow
def test_make_data_full_is_deterministic_and_holds_windows_of_1025(tmp_path):
    first = make_data(tmp_path / "a", "--full")
    second = make_data(tmp_path / "b", "--full")
    full = [p for p in first if "/full/" in p]
    assert [os.path.basename(p) for p in full] == ["train.jsonl.gz", "valid.jsonl.gz"]
    for a, b in zip(first, second, strict=True):
        assert filecmp.cmp(a, b, shallow=False)
    with gzip.open(full[1], "rt") as lines:
        records = [json.loads(line)["input_ids"] for line in lines]
    assert len(records) == 256 and {len(r) for r in records} == {1025}
    ignore = (tmp_path / "a" / "data" / "full" / ".gitignore").read_text()
    assert ignore.splitlines()[-1] == "*"


@pytest.mark.slow
def test_make_data_gpt2_is_deterministic_and_holds_gpt2_windows(tmp_path):
    first = make_data(tmp_path / "a", "--gpt2")
    second = make_data(tmp_path / "b", "--gpt2")
    gpt2 = [p for p in first if "/gpt2/" in p]
    assert [os.path.basename(p) for p in gpt2] == ["train.jsonl.gz"]
    for a, b in zip(first, second, strict=True):
        assert filecmp.cmp(a, b, shallow=False)
    for path in first[:3]:  # the shipped files, unchanged
        assert (
            Path(path).read_bytes()
            == (EXAMPLES / "data" / Path(path).name).read_bytes()
        )
    with gzip.open(gpt2[0], "rt") as lines:
        records = [json.loads(line)["input_ids"] for line in lines]
    assert len(records) == 2048 and {len(r) for r in records} == {1025}
    assert max(max(r) for r in records) == 50303 and min(min(r) for r in records) == 0
    ignore = (tmp_path / "a" / "data" / "gpt2" / ".gitignore").read_text()
    assert ignore.splitlines()[-1] == "*"


def test_gpt2_reads_the_shipped_data_when_tiny_and_data_gpt2_otherwise():
    path = str(EXAMPLES / "gpt2.sx")
    files = {
        variant: evaluate_file(path, Selection(variant=variant))
        .value("train-loader")
        .sources[0]
        .paths
        for variant in (None, "tiny")
    }
    assert files == {
        None: ("data/gpt2/train.jsonl.gz",),
        "tiny": ("data/train.jsonl.gz",),
    }
