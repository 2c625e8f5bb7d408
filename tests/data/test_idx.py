"""The IDX reader and writer, and load_mnist_dir."""

import gzip
import os
import re

import numpy as np
import pytest
from fake_mnist import fake_mnist

import jaxnitro as nx
from jaxnitro.data.idx import load_mnist_dir, read_idx, write_idx


@pytest.mark.parametrize("name", ["images-idx3-ubyte", "images-idx3-ubyte.gz"])
def test_idx_round_trip_of_mnist_shaped_arrays(tmp_path, name):
    images = np.random.default_rng(1).integers(0, 256, (5, 28, 28), dtype=np.uint8)
    write_idx(tmp_path / name, images)
    raw = (tmp_path / name).read_bytes()
    if name.endswith(".gz"):
        raw = gzip.decompress(raw)
    assert raw[:16] == bytes.fromhex("00000803" + "00000005" + "0000001c" * 2)
    back = read_idx(tmp_path / name)
    assert back.dtype == np.uint8 and back.shape == (5, 28, 28)
    np.testing.assert_array_equal(back, images)


@pytest.mark.parametrize(
    "dtype", ["uint8", "int8", "int16", "int32", "float32", "float64"]
)
def test_idx_round_trip_of_every_dtype(tmp_path, dtype):
    array = (np.arange(24).reshape(2, 3, 4) - 7).astype(dtype)
    write_idx(tmp_path / "a.gz", array)
    back = read_idx(tmp_path / "a.gz")
    assert back.dtype == np.dtype(dtype) and back.dtype.isnative
    np.testing.assert_array_equal(back, array)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "bad magic number \\(empty\\)"),
        (bytes.fromhex("01000801") + b"\0\0\0\1x", "bad magic number 01000801"),
        (bytes.fromhex("00000701") + b"\0\0\0\1x", "dtype code 0x07 is not one of"),
        (bytes.fromhex("00000802") + b"\0\0\0\1", "is truncated"),
        (bytes.fromhex("00000801") + b"\0\0\0\3ab", "size mismatch.*holds 2 data"),
        (bytes.fromhex("00000801") + b"\0\0\0\1ab", "size mismatch.*holds 2 data"),
    ],
)
def test_a_malformed_idx_file_names_the_file_and_the_fault(tmp_path, content, message):
    path = tmp_path / "broken-idx1-ubyte"
    path.write_bytes(content)
    with pytest.raises(
        nx.ConfigError, match=f"IDX file {re.escape(str(path))} .*{message}"
    ):
        read_idx(path)


def test_unreadable_idx_files_and_unwritable_dtypes_are_refused(tmp_path):
    with pytest.raises(nx.ConfigError, match="IDX file .*nothing-here does not exist"):
        read_idx(tmp_path / "nothing-here")
    (tmp_path / "fake.gz").write_bytes(b"not gzip at all")
    with pytest.raises(nx.ConfigError, match="fake.gz cannot be read"):
        read_idx(tmp_path / "fake.gz")
    write_idx(tmp_path / "cut.gz", np.zeros((50, 50), np.uint8))
    (tmp_path / "cut.gz").write_bytes((tmp_path / "cut.gz").read_bytes()[:-12])
    with pytest.raises(nx.ConfigError, match="cut.gz cannot be read"):
        read_idx(tmp_path / "cut.gz")
    with pytest.raises(nx.ConfigError, match="dtype uint16 has no IDX code"):
        write_idx(tmp_path / "x", np.zeros(3, np.uint16))
    with pytest.raises(nx.ConfigError, match="1 to 255 dims, got 0"):
        write_idx(tmp_path / "x", np.zeros((), np.uint8))


@pytest.mark.parametrize("gz", [False, True])
def test_load_mnist_dir_reads_the_four_files(tmp_path, gz):
    written = fake_mnist(tmp_path / "mnist", 7, 3, gz=gz)
    loaded = load_mnist_dir(tmp_path / "mnist")
    assert set(loaded) == set(written)
    for key, array in written.items():
        np.testing.assert_array_equal(loaded[key], array)


def test_load_mnist_dir_accepts_the_dot_spelling(tmp_path):
    written = fake_mnist(tmp_path, 4, 2)
    os.rename(
        tmp_path / "train-images-idx3-ubyte", tmp_path / "train-images.idx3-ubyte"
    )
    np.testing.assert_array_equal(
        load_mnist_dir(tmp_path)["train_images"], written["train_images"]
    )


def test_load_mnist_dir_names_what_is_missing_or_inconsistent(tmp_path):
    with pytest.raises(
        nx.ConfigError, match="MNIST directory .*nowhere does not exist"
    ):
        load_mnist_dir(tmp_path / "nowhere")
    fake_mnist(tmp_path, 4, 2)
    os.remove(tmp_path / "t10k-labels-idx1-ubyte")
    with pytest.raises(
        nx.ConfigError,
        match=f"MNIST directory {re.escape(str(tmp_path))} has no "
        "t10k-labels-idx1-ubyte .*Nothing is downloaded",
    ):
        load_mnist_dir(tmp_path)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.zeros(3, np.uint8))
    with pytest.raises(nx.ConfigError, match="test images have shape \\(2, 28, 28\\)"):
        load_mnist_dir(tmp_path)
