"""`changed_field`: which field of a batch left the compiled signature, and how."""

import numpy as np

from jaxnitro.data.signature import batch_signature, changed_field

FIRST = {"x": np.zeros((4, 3), np.float32), "y": np.zeros((4,), np.int32)}


def test_a_matching_batch_has_no_changed_field():
    assert changed_field(batch_signature(FIRST), dict(FIRST), "train", 2, 1) is None


def test_float64_is_the_float32_the_device_sees_without_x64():
    batch = {**FIRST, "x": np.zeros((4, 3), np.float64)}
    assert changed_field(batch_signature(FIRST), batch, "train", 2, 1) is None


def test_a_changed_dtype_names_split_index_field_and_both_signatures():
    batch = {**FIRST, "y": np.zeros((4,), np.float32)}
    message = changed_field(batch_signature(FIRST), batch, "train", 7, 3)
    assert message is not None
    assert message.startswith(
        "Batch 7 of split `train` (epoch 3) changes the dtype of field `y`: "
        "expected int32[4] as in the first batch, received float32[4]."
    )


def test_a_changed_trailing_shape_is_a_shape_change():
    batch = {**FIRST, "x": np.zeros((4, 5), np.float32)}
    message = changed_field(batch_signature(FIRST), batch, "train", 1, 1)
    assert message is not None
    assert "changes the shape of field `x`: expected float32[4, 3]" in message
    assert "received float32[4, 5]" in message


def test_a_missing_field_is_named_with_both_field_lists():
    message = changed_field(batch_signature(FIRST), {"x": FIRST["x"]}, "train", 1, 1)
    assert message is not None
    assert "has fields ['x']; the first batch's ['x', 'y']" in message
