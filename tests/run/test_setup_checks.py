"""Setup's refusals of bad splits: empty splits, batches of size 0, an eval split
missing a field its hooks need, each named before anything compiles or trains."""

import numpy as np
import pytest
from experiments import Tiny, TinyMetrics, make_batches

import jaxnitro as nx


def build(experiment=None, **data):
    return nx.Nitro(experiment or Tiny(), data=data, logger=None, checkpointer=None)


def emptied(batch):
    return {k: v[:0] for k, v in batch.items()}


@pytest.mark.parametrize(
    "split, why",
    [
        ("train", "training would run no step"),
        ("val", "no checkpoint would be ranked and the monitor would watch no metric"),
        ("test", "evaluating it would score nothing"),
    ],
)
def test_an_empty_split_is_refused_naming_it(split, why):
    data = {"train": make_batches(32, 16), split: []}
    expected = rf"Split `{split}` has no batches .*{why}"
    with pytest.raises(nx.ConfigError, match=expected):
        build(**data)


@pytest.mark.parametrize("split", ["train", "val"])
def test_a_first_batch_of_size_zero_is_refused(split):
    data = {"train": make_batches(32, 16), "val": make_batches(32, 16, seed=1)}
    data[split][0] = emptied(data[split][0])
    with pytest.raises(
        nx.ConfigError, match=rf"The first batch of split `{split}` holds 0 samples"
    ):
        build(**data)


def test_a_last_train_batch_of_size_zero_is_refused():
    train = make_batches(32, 16) + [emptied(make_batches(16, 16)[0])]
    with pytest.raises(
        nx.ConfigError, match="The last batch of split `train` holds 0 samples"
    ):
        build(train=train)


def test_a_val_split_without_the_loss_field_is_refused_at_setup():
    val = [{"x": b["x"]} for b in make_batches(32, 16, seed=1)]
    with pytest.raises(
        nx.RoutingError,
        match=r"Split `val` cannot be evaluated: `loss` declares the batch field `y`",
    ):
        build(train=make_batches(32, 16), val=val)


def test_a_val_split_without_a_metrics_field_is_refused_at_setup():
    val = [{"x": b["x"]} for b in make_batches(32, 16, seed=1)]
    with pytest.raises(
        nx.RoutingError,
        match=r"Split `val` cannot be evaluated: `metrics` declares the batch field",
    ):
        build(TinyMetrics(), train=make_batches(32, 16), val=val)


def test_a_test_split_of_inputs_only_is_accepted_for_predict():
    test = [{"x": b["x"]} for b in make_batches(32, 16, seed=2)]
    nitro = build(train=make_batches(32, 16), test=test)
    assert np.shape(nitro.predict(test[0])) == (16, 3)


def test_a_split_without_the_forward_field_is_refused_at_setup():
    test = [{"y": b["y"]} for b in make_batches(32, 16, seed=2)]
    with pytest.raises(
        nx.RoutingError,
        match=r"Split `test` cannot be evaluated: `forward` declares the batch field",
    ):
        build(train=make_batches(32, 16), test=test)
