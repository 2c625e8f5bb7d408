"""A fake MNIST directory: random images and labels in the four IDX files."""

from pathlib import Path

import numpy as np

from jaxnitro.data.idx import MNIST_FILES, write_idx


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
