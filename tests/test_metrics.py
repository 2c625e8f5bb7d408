"""Metric modes and accumulation: divided, summed, concatenated, in groups, and the
refusals of what is not a (value, mode) pair.
"""

import collections

import jax.numpy as jnp
import numpy as np
import pytest
from experiments import Tiny

import jaxnitro as nx
from jaxnitro.logging.values import flatten
from jaxnitro.metrics import MetricAccumulator


def quiet(**kw):
    return {"logger": None, "checkpointer": None, **kw}


def test_accumulator_modes():
    acc = MetricAccumulator()
    acc.add(
        {
            "acc": (3, 4),
            "cm": (np.eye(2), None),
            "s": (np.array([1.0, 2.0]), "concat"),
            "group": {"a": (1.0, 1), "b": (2.0, "sum")},
            "whole": ({"p": 1.0, "q": 2.0}, "sum"),
        }
    )
    acc.add(
        {
            "acc": (1, 4),
            "cm": (np.eye(2), "sum"),
            "s": (np.array([3.0]), "concat"),
            "group": {"a": (3.0, 1), "b": (2.0, "sum")},
            "whole": ({"p": 1.0, "q": 2.0}, "sum"),
        }
    )
    result = acc.result()
    assert result["acc"] == 0.5
    np.testing.assert_array_equal(result["cm"], 2 * np.eye(2))
    np.testing.assert_array_equal(result["s"], [1.0, 2.0, 3.0])
    assert result["group"] == {"a": 2.0, "b": 4.0}
    assert result["whole"] == {"p": 2.0, "q": 4.0}


def test_sums_keep_integer_dtypes():
    acc = MetricAccumulator()
    for _ in range(2):
        acc.add(
            {
                "cm": (np.eye(2, dtype=np.int32), "sum"),
                "n": (3, None),
                "hits": (np.array([True, False, True]), "sum"),
                "acc": (2, 3),
            }
        )
    result = acc.result()
    assert result["cm"].dtype == np.int64
    np.testing.assert_array_equal(result["cm"], 2 * np.eye(2))
    assert type(result["n"]) is int and result["n"] == 6
    np.testing.assert_array_equal(result["hits"], [2, 0, 2])
    assert result["hits"].dtype == np.int64
    assert result["acc"] == pytest.approx(2 / 3)  # a count divides: a float


Counts = collections.namedtuple("Counts", "hits n")


def test_namedtuple_and_tuple_groups_keep_their_shape():
    acc = MetricAccumulator()
    for hits in (3, 1):
        acc.add(
            {
                "nt": Counts(hits=(hits, 4), n=(4, "sum")),
                "whole": (Counts(hits=hits, n=4.0), "sum"),
                "tup": ((hits, 4), (4, "sum"), {"a": (1, None)}),
            }
        )
    result = acc.result()
    assert result["nt"] == Counts(hits=0.5, n=8) and type(result["nt"]) is Counts
    assert result["whole"] == Counts(hits=4, n=8.0)
    assert result["tup"] == (0.5, 8, {"a": 2})
    assert flatten(result)["nt/hits"] == 0.5  # the history's and the log's keys
    with pytest.raises(
        nx.HookError,
        match="or a group of them: a dict, a namedtuple or a tuple of pairs; got list",
    ):
        acc.add({"g": [(1, 2), (3, "sum")]})
    with pytest.raises(nx.HookError, match="A mode on a group takes a dict or a "):
        acc.add({"g": ((1, 2.0), "sum")})


class Grouped(Tiny):
    def metrics(self, logits, *, y):
        hits = (jnp.argmax(logits, -1) == jnp.argmax(y, -1)).sum()
        n = y.shape[0]
        return {"nt": Counts(hits=(hits, n), n=(n, "sum")), "tup": ((hits, "sum"),)}

    def metrics_residency(self, hook):
        return "device"


def test_groups_and_integer_sums_come_back_from_a_device_program():
    result = nx.Nitro(Grouped(), **quiet()).evaluate("test")
    assert type(result["nt"]) is Counts and result["nt"].n == 40
    assert isinstance(result["tup"], tuple) and type(result["tup"][0]) is int
    assert result["nt"].hits == pytest.approx(result["tup"][0] / 40)


def test_a_leaf_covered_by_two_modes_is_refused():
    acc = MetricAccumulator()
    with pytest.raises(
        nx.HookError,
        match="metric `g/a` is a \\(value, mode\\) pair inside a pair or a group "
        "that already has a mode: each leaf must be covered by exactly one",
    ):
        acc.add({"g": ({"a": (3, 2)}, "sum")})
    with pytest.raises(nx.HookError, match="metric `g` is a \\(value, mode\\) pair"):
        acc.add({"g": ((3, 2.0), "sum")})


@pytest.mark.parametrize(
    "scores, message",
    [
        (  # handed back by the default finalize_metrics as it came
            lambda logits: logits[:, 0],
            'metric `s` is "concat", and finalize_metrics returned its 24 '
            "per-sample entries unreduced",
        ),
        (
            lambda logits: np.ones(3),
            'metric `s` is "concat" but returned 3 entries for a batch of 16 '
            "samples; a concat metric needs one entry per sample",
        ),
    ],
    ids=["unreduced", "wrong-length"],
)
def test_a_concat_metric_is_refused_unreduced_or_of_the_wrong_length(scores, message):
    class Concat(Tiny):
        def metrics(self, logits, *, y):
            return {"s": (scores(logits), "concat")}

    with pytest.raises(nx.HookError, match=message):
        nx.Nitro(Concat(), **quiet()).validate()


def test_a_metric_that_is_not_a_pair_is_refused():
    acc = MetricAccumulator()
    with pytest.raises(
        nx.HookError, match="metric `acc` must be a \\(value, mode\\) pair"
    ):
        acc.add({"acc": 0.5})
    with pytest.raises(
        nx.HookError, match='metric `s` is "concat" but a batch returned a scalar'
    ):
        acc.add({"s": (1.0, "concat")})
