"""Write the small data the example run files read, deterministically.

    python examples/runfiles/make_data.py [DIR]

A run file's `(files [...])` paths are relative to the run file, so the data lives
in `data/` beside `minimal.sx` and `realistic.sx` (DIR defaults to that folder).
Each record is one JSON line `{"input_ids": [...]}` of token ids drawn from a
seeded stream with structure a small model learns in a few steps: each sequence
counts up from a random start by a random stride, modulo the vocabulary it uses.

- `data/tiny-train.jsonl.gz`: 256 windows of 17 tokens below 32 (minimal.sx).
- `data/train.jsonl.gz`, `data/valid.jsonl.gz`: 512 and 64 windows of 65 tokens
  below 256, the window of realistic.sx's `smoke` variant (seq 64, window 65).

The same command writes the same bytes on every machine (gzip's timestamp is 0).
"""

from __future__ import annotations

import gzip
import json
import os
import sys

import numpy as np


def windows(count: int, length: int, vocab: int, seed: int) -> np.ndarray:
    """`count` int32 windows [count, length]: start + stride * position, mod vocab."""
    rng = np.random.default_rng(seed)
    start = rng.integers(vocab, size=(count, 1))
    stride = rng.integers(1, 4, size=(count, 1))
    return ((start + stride * np.arange(length)[None, :]) % vocab).astype(np.int32)


def write_jsonl_gz(path: str, rows: np.ndarray) -> None:
    """Write `rows` as `{"input_ids": [...]}` lines, gzip with a fixed header."""
    text = "".join(json.dumps({"input_ids": row.tolist()}) + "\n" for row in rows)
    temporary = path + ".partial"
    with (
        open(temporary, "wb") as raw,
        gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as out,
    ):
        out.write(text.encode("utf-8"))
    os.replace(temporary, path)  # never a half-written data file


def main(folder: str) -> list[str]:
    """Write every example data file under `folder/data`; their paths."""
    data = os.path.join(folder, "data")
    os.makedirs(data, exist_ok=True)
    files = {
        "tiny-train.jsonl.gz": windows(256, 17, 32, seed=0),
        "train.jsonl.gz": windows(512, 65, 256, seed=1),
        "valid.jsonl.gz": windows(64, 65, 256, seed=2),
    }
    written = []
    for name, rows in files.items():
        path = os.path.join(data, name)
        write_jsonl_gz(path, rows)
        written.append(path)
    return written


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    for path in main(sys.argv[1] if len(sys.argv) > 1 else here):
        print(path)
