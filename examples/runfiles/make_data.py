"""Write the data the example run files read, deterministically.

    python examples/runfiles/make_data.py [DIR] [--full] [--gpt2]

A run file's `(files [...])` paths are relative to the run file, so the data lives
in `data/` beside `minimal.sx`, `realistic.sx` and `gpt2.sx` (DIR defaults to that
folder).
Each record is one JSON line `{"input_ids": [...]}` of token ids drawn from a
seeded stream with structure a small model learns in a few steps: each sequence
counts up from a random start by a random stride, modulo the vocabulary it uses.

Shipped in the repository (the command writes the same bytes again):

- `data/tiny-train.jsonl.gz`: 256 windows of 17 tokens below 32 (minimal.sx).
- `data/train.jsonl.gz`, `data/valid.jsonl.gz`: 512 and 64 windows of 65 tokens
  below 256, the window of realistic.sx's `smoke` variant (seq 64, window 65) and
  of gpt2.sx's `tiny` variant.

Written on demand with `--full`, not shipped (150 KB of gzip, 9 MB of JSON text;
`data/full/.gitignore` keeps them out of git):

- `data/full/train.jsonl.gz`, `data/full/valid.jsonl.gz`: 2048 and 256 windows of
  1025 tokens below 256, the window of realistic.sx's default and `small`
  variants (seq 1024), which read `data/full/` whenever seq is not 64.

Written on demand with `--gpt2`, not shipped (about 5 MB of gzip; `data/gpt2/
.gitignore` keeps it out of git):

- `data/gpt2/train.jsonl.gz`: 2048 windows of 1025 tokens below 50304, GPT-2
  small's window and vocabulary (gpt2.sx without a variant; 128 steps of 16
  windows a pass over them, which the loader reshuffles for the next).

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

GPT2 = {
    "gpt2/train.jsonl.gz": (2048, 1025, 50304, 5),
}
"""The file `--gpt2` writes for gpt2.sx's GPT-2 small, in the same terms."""

ON_DEMAND = {"full": FULL, "gpt2": GPT2}
"""The sets written on request, by the folder under `data/` each fills."""


def main(
    folder: str, *, full: bool = False, gpt2: bool = False, shipped: bool = True
) -> list[str]:
    """Write the example data under `folder/data`: the shipped files (unless not
    `shipped`), `data/full` when `full`, `data/gpt2` when `gpt2`; the paths
    written."""
    data = os.path.join(folder, "data")
    chosen = {"full": full, "gpt2": gpt2}
    files = dict(SHIPPED) if shipped else {}
    for name, wanted in chosen.items():
        if wanted:
            files.update(ON_DEMAND[name])
    written = []
    for name, (count, length, vocab, seed) in files.items():
        path = os.path.join(data, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_jsonl_gz(path, windows(count, length, vocab, seed))
        written.append(path)
    for name, wanted in chosen.items():
        if wanted:
            with open(os.path.join(data, name, ".gitignore"), "w") as ignore:
                ignore.write(f"# written by make_data.py --{name}, not shipped\n*\n")
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
    parser.add_argument(
        "--gpt2",
        action="store_true",
        help="also write data/gpt2/ (windows of 1025 tokens below 50304) for gpt2.sx",
    )
    args = parser.parse_args()
    for path in main(args.folder, full=args.full, gpt2=args.gpt2):
        print(path)
