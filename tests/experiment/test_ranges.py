"""Declared field ranges: `field(ge=..., le=...)` refused at construction."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxnitro as nx


class Ranged(nx.Experiment):
    width: nx.GraphConst[int] = nx.field(default=8, ge=1)
    dropout: nx.Device[float] = nx.field(default=0.1, ge=0.0, le=1.0)
    max_epochs: int = 2


def test_values_in_range_are_accepted_and_the_range_is_in_the_metadata():
    e = Ranged(width=1, dropout=1.0)
    assert (e.width, e.dropout) == (1, 1.0)
    meta = nx.config_metadata(Ranged)
    assert (meta["width"].ge, meta["width"].le) == (1, None)
    assert (meta["dropout"].ge, meta["dropout"].le) == (0.0, 1.0)
    assert (meta["max_epochs"].ge, meta["max_epochs"].le) == (None, None)
    Ranged(width=np.int64(3))  # a NumPy integer is a number


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"width": 0},
            r"Ranged.width must be >= 1, got 0: the field declares ge=1. Pass a "
            r"value in that range, e.g. width=1.",
        ),
        ({"width": -4}, r"Ranged.width must be >= 1, got -4"),
        ({"dropout": 1.5}, r"Ranged.dropout must be <= 1.0, got 1.5"),
        ({"dropout": float("nan")}, r"declares a range \(ge=0.0, le=1.0\)"),
        ({"dropout": "0.5"}, r"takes a number, got '0.5' \(a str\)"),
        ({"dropout": True}, r"takes a number, got True \(a bool\)"),
    ],
)
def test_values_out_of_range_are_refused_naming_field_value_and_range(values, message):
    with pytest.raises(nx.ConfigError, match=message):
        Ranged(**values)


def test_a_traced_device_value_is_let_through():
    e = Ranged()
    doubled = jax.jit(lambda e: e.dropout * 2)(e)
    assert float(doubled) == pytest.approx(0.2)
    assert jax.tree_util.tree_map(jnp.asarray, e).dropout.shape == ()


@pytest.mark.parametrize(
    ("bounds", "problem"),
    [({"ge": 2, "le": 1}, "ge > le"), ({"ge": float("inf")}, "not a finite real")],
)
def test_bad_bounds_are_refused_when_declared(bounds, problem):
    with pytest.raises(nx.ConfigError, match=problem):
        nx.field(default=1, **bounds)
