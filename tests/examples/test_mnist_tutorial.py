"""The IDX reader and writer, and the MNIST tutorial example, end to end."""

import gzip
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import jaxnitro as nx
from jaxnitro.data.idx import MNIST_FILES, load_mnist_dir, read_idx, write_idx

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mnist_tutorial.py"


@pytest.fixture(scope="module")
def tutorial():
    """The example script as a module (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location("mnist_tutorial", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and field docs look the module up
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def fake_mnist(directory: Path, n_train: int, n_test: int, *, gz: bool = False):
    """Random uint8 images (n, 28, 28) and labels in the four MNIST files."""
    rng = np.random.default_rng(0)
    arrays = {
        "train_images": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train_labels": rng.integers(0, 10, n_train, dtype=np.uint8),
        "test_images": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "test_labels": rng.integers(0, 10, n_test, dtype=np.uint8),
    }
    directory.mkdir(parents=True, exist_ok=True)
    for key, name in MNIST_FILES.items():
        write_idx(directory / (name + (".gz" if gz else "")), arrays[key])
    return arrays


# --- the IDX format -------------------------------------------------------------------
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


# --- the tutorial ---------------------------------------------------------------------
def test_tutorial_trains_on_an_mnist_directory(tutorial, tmp_path, monkeypatch):
    # 1200 training images: 1100 train (22 batches of 50, an even count for accum 2)
    # and 100 val; 130 test images end in a short batch that is padded.
    arrays = fake_mnist(tmp_path / "mnist", 1200, 130, gz=True)
    monkeypatch.setenv("NITRO_MNIST_DIR", str(tmp_path / "mnist"))
    run_dir = tmp_path / "run"
    nitro = nx.Nitro(tutorial.MnistMLP(max_epochs=1), run_dir=str(run_dir))
    assert nitro.experiment.mnist_dir == str(tmp_path / "mnist")
    counts = np.bincount(arrays["train_labels"][:1100], minlength=10)
    np.testing.assert_allclose(
        nitro.device_value("class_weights"), 1100 / (10 * counts), rtol=1e-6
    )

    nitro.train()
    assert [row["epoch"] for row in nitro.history] == [1]
    assert np.isfinite(nitro.history[1]["train_loss"])  # epoch 1
    assert (run_dir / "manifest.json").exists()
    assert nx.read_manifest(str(run_dir))
    test = nitro.evaluate(split="test")
    assert 0.0 <= test["acc"] <= 1.0 and 0.0 <= test["macro_recall"] <= 1.0

    images = arrays["test_images"][:3].reshape(3, -1).astype(np.float32) / 255
    before = nx.cache_stats()
    nitro.set_device(temperature=2.0)
    assert nitro.predict({"img": images}).shape == (3, 10)
    assert nx.cache_stats()["misses"] == before["misses"]


def test_tutorial_script_runs_in_smoke_mode(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "NITRO_MNIST_DIR"}
    env.update(
        NITRO_EXAMPLE_EPOCHS="1",
        NITRO_RUN_DIR=str(tmp_path / "run"),
        JAXNITRO_COMPILATION_CACHE="off",
    )
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "test accuracy: " in done.stdout
    assert (tmp_path / "run" / "manifest.json").exists()
    # The spec's log_confusion recipe: stashed in finalize_metrics, logged by a
    # phase monitor on the transition out of validation.
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    confusion = [json.loads(x) for x in lines if '"type": "confusion"' in x]
    assert len(confusion) == 1 and confusion[0]["epoch"] == 1
    matrix = np.asarray(confusion[0]["matrix"])
    assert matrix.shape == (10, 10) and matrix.sum() == 297  # the val split
