"""The IDX file format of MNIST: a reader, a writer, and the four-file directory.

An IDX file is a 4-byte magic number (two zero bytes, a dtype code, the number of
dimensions), one big-endian uint32 per dimension, then the data in big-endian C order.
A name ending in `.gz` is read and written through gzip. Nothing here downloads
anything: `load_mnist_dir` reads files you already have.

    images = read_idx("mnist/train-images-idx3-ubyte.gz")    # uint8 (60000, 28, 28)
    splits = load_mnist_dir("mnist")                         # the four arrays
"""

from __future__ import annotations

import gzip
import os
import struct
import zlib
from typing import Any

import numpy as np

from ..errors import ConfigError

# dtype code -> big-endian NumPy dtype of the data.
_CODES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
_CODE_OF = {np.dtype(spec).newbyteorder("="): code for code, spec in _CODES.items()}

# The four standard MNIST files, by the key `load_mnist_dir` returns them under.
MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}


def _opener(path: str) -> Any:
    return gzip.open if path.endswith(".gz") else open


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read one IDX file (gzipped when its name ends in `.gz`) into a NumPy array.

    Returns the array with the file's shape and dtype, in native byte order. Raises
    ConfigError, naming the file, when it is missing or unreadable, has a bad magic
    number or dtype code, or holds more or fewer bytes than its header declares.
    """
    path = os.fspath(path)
    try:
        with _opener(path)(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise ConfigError(f"IDX file {path} does not exist.") from None
    except (OSError, EOFError, zlib.error) as error:
        raise ConfigError(f"IDX file {path} cannot be read: {error}.") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise ConfigError(
            f"IDX file {path} has a bad magic number {raw[:4].hex() or '(empty)'}: an "
            f"IDX file starts with two zero bytes, a dtype code and the number of "
            f"dimensions (e.g. 00000803 for uint8 images)."
        )
    code, ndim = raw[2], raw[3]
    if code not in _CODES:
        known = ", ".join(f"0x{c:02X}" for c in _CODES)
        raise ConfigError(
            f"IDX file {path} has a bad magic number {raw[:4].hex()}: dtype code "
            f"0x{code:02X} is not one of {known}."
        )
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ConfigError(
            f"IDX file {path} is truncated: its magic number declares {ndim} "
            f"dimensions but the file ends inside the dimension sizes."
        )
    shape = struct.unpack(f">{ndim}I", raw[4:header])
    dtype = np.dtype(_CODES[code])
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header != expected:
        raise ConfigError(
            f"IDX file {path} has a size mismatch: its header declares shape {shape} "
            f"of {dtype.newbyteorder('=').name} ({expected} data bytes), but the "
            f"file holds {len(raw) - header} data bytes."
        )
    data = np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)
    return data.astype(dtype.newbyteorder("="))


def write_idx(path: str | os.PathLike[str], array: np.ndarray) -> None:
    """Write `array` as an IDX file, gzipped when the name ends in `.gz`.

    `array` is uint8, int8, int16, int32, float32 or float64 with 1 to 255 dims;
    anything else raises ConfigError. An existing file is replaced.
    """
    path = os.fspath(path)
    array = np.asarray(array)
    code = _CODE_OF.get(array.dtype.newbyteorder("="))
    if code is None:
        raise ConfigError(
            f"write_idx({path}): dtype {array.dtype} has no IDX code; convert to "
            f"uint8, int8, int16, int32, float32 or float64."
        )
    if not 1 <= array.ndim <= 255:
        raise ConfigError(
            f"write_idx({path}): an IDX array has 1 to 255 dims, got {array.ndim}."
        )
    header = bytes((0, 0, code, array.ndim)) + struct.pack(
        f">{array.ndim}I", *array.shape
    )
    data = np.ascontiguousarray(array, dtype=np.dtype(_CODES[code])).tobytes()
    with _opener(path)(path, "wb") as f:
        f.write(header + data)


def _find(directory: str, name: str) -> str:
    dotted = name.replace("-idx", ".idx")
    candidates = [name, name + ".gz", dotted, dotted + ".gz"]
    for candidate in candidates:
        full = os.path.join(directory, candidate)
        if os.path.isfile(full):
            return full
    raise ConfigError(
        f"MNIST directory {directory} has no {name} (looked for "
        f"{', '.join(candidates)}). Nothing is downloaded: put the four MNIST IDX "
        f"files ({', '.join(MNIST_FILES.values())}) there."
    )


def load_mnist_dir(directory: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """Read the four standard MNIST IDX files from `directory`.

    Each file may be plain or gzipped (`.gz`), and spelled `train-images-idx3-ubyte`
    or `train-images.idx3-ubyte`.

    Returns:
        `{"train_images", "train_labels", "test_images", "test_labels"}`: images
        uint8 (n, 28, 28), labels uint8 (n,).

    Raises:
        ConfigError: the directory or a file is missing, a file is malformed, or an
            images file and its labels file disagree on the sample count.
    """
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise ConfigError(f"MNIST directory {directory} does not exist.")
    arrays = {
        key: read_idx(_find(directory, name)) for key, name in MNIST_FILES.items()
    }
    for split in ("train", "test"):
        images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
            raise ConfigError(
                f"MNIST directory {directory}: the {split} images have shape "
                f"{images.shape} and the labels {labels.shape}; expected (n, rows, "
                f"cols) images and (n,) labels with the same n."
            )
    return arrays
