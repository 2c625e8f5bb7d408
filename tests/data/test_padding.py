"""Padding an eval batch to the compiled width: the last sample repeated, and a part
without rows (a process's empty share across processes) kept at the width."""

import numpy as np

from jaxnitro.data.padding import pad_batch


def test_a_short_batch_repeats_its_last_sample():
    padded = pad_batch({"x": np.array([[1.0], [2.0]])}, 4)
    assert padded["x"][:, 0].tolist() == [1.0, 2.0, 2.0, 2.0]


def test_a_batch_without_rows_is_filled_with_zeros_of_its_dtype():
    padded = pad_batch({"y": np.zeros((0, 3), np.int32)}, 2)
    assert padded["y"].shape == (2, 3) and padded["y"].dtype == np.int32
    assert not padded["y"].any()
