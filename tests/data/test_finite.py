"""`nonfinite_fields`: which inputs of a batch hold NaN or inf, counted."""

import ml_dtypes
import numpy as np

from jaxnitro.data.finite import describe_nonfinite, nonfinite_fields


def test_counts_nan_and_inf_per_floating_field():
    x = np.ones((2, 3), np.float32)
    x[0, 1], x[1, 2], x[1, 0] = np.nan, np.inf, -np.inf
    batch = {"x": x, "label": np.array([1, 2]), "name": np.array(["a", "b"])}
    found = nonfinite_fields(batch)
    assert found == {"x": (1, 2, 6)}
    assert describe_nonfinite(found) == "`x` holds 1 NaN and 2 inf of 6 values"


def test_a_finite_batch_and_bfloat16_fields_are_read():
    finite = {"x": np.ones(3, np.float32), "i": np.arange(3)}
    assert nonfinite_fields(finite) == {}
    half = np.array([1.0, np.nan], ml_dtypes.bfloat16)
    assert nonfinite_fields({"h": half}) == {"h": (1, 0, 2)}
