"""Write the data the example run files read, deterministically.

    python examples/runfiles/make_data.py [DIR] [--full]

A run file's `(files [...])` paths are relative to the run file, so the data lives
in `data/` beside `minimal.sx` and `realistic.sx` (DIR defaults to that folder).
Each record is one JSON line `{"input_ids": [...]}` of token ids drawn from a
seeded stream with structure a small model learns in a few steps: each sequence
counts up from a random start by a random stride, modulo the vocabulary it uses.

Shipped in the repository (the command writes the same bytes again):

- `data/tiny-train.jsonl.gz`: 256 windows of 17 tokens below 32 (minimal.sx).
- `data/train.jsonl.gz`, `data/valid.jsonl.gz`: 512 and 64 windows of 65 tokens
  below 256, the window of realistic.sx's `smoke` variant (seq 64, window 65).

Written on demand with `--full`, not shipped (150 KB of gzip, 9 MB of JSON text;
`data/full/.gitignore` keeps them out of git):

- `data/full/train.jsonl.gz`, `data/full/valid.jsonl.gz`: 2048 and 256 windows of
  1025 tokens below 256, the window of realistic.sx's default and `small`
  variants (seq 1024), which read `data/full/` whenever seq is not 64.

The same command writes the same bytes on every machine (gzip's timestamp is 0).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os

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


SHIPPED = {
    "tiny-train.jsonl.gz": (256, 17, 32, 0),
    "train.jsonl.gz": (512, 65, 256, 1),
    "valid.jsonl.gz": (64, 65, 256, 2),
}
"""The shipped files: name -> (windows, tokens a window, vocabulary, seed)."""

FULL = {
    "full/train.jsonl.gz": (2048, 1025, 256, 3),
    "full/valid.jsonl.gz": (256, 1025, 256, 4),
}
"""The files `--full` writes for realistic.sx's seq 1024, in the same terms."""


def main(folder: str, *, full: bool = False) -> list[str]:
    """Write the example data under `folder/data` (and `data/full` when `full`);
    the paths written."""
    data = os.path.join(folder, "data")
    files = {**SHIPPED, **(FULL if full else {})}
    written = []
    for name, (count, length, vocab, seed) in files.items():
        path = os.path.join(data, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_jsonl_gz(path, windows(count, length, vocab, seed))
        written.append(path)
    if full:
        with open(os.path.join(data, "full", ".gitignore"), "w") as ignore:
            ignore.write("# written by make_data.py --full, not shipped\n*\n")
    return written


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", default=here)
    parser.add_argument(
        "--full",
        action="store_true",
        help="also write data/full/ (windows of 1025 tokens) for seq 1024",
    )
    args = parser.parse_args()
    for path in main(args.folder, full=args.full):
        print(path)
