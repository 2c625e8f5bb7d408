"""A program's declaration: arguments by field name, one key for both lookups."""

from typing import Any, NamedTuple

import pytest

from jaxnitro.compile.declaration import Layout, Like, Program
from jaxnitro.compile.kinds import (
    EVAL_FORWARD,
    EVAL_LOSS,
    EVAL_METRICS,
    MANUAL_STEP,
    TRAIN_STEP,
    train_layout,
)
from jaxnitro.errors import NitroError


class Args(NamedTuple):
    values: Any
    weights: Any
    batch: Any


def declared(**kw: Any) -> Program:
    return Program("demo", Args, lambda: None, ("loss",), **kw)


def test_donation_and_layout_resolve_from_field_names_to_positions():
    program = declared(
        donate=("weights",),
        layout=Layout({"weights": "state", "batch": "batch"}, (Like("weights"),)),
    )
    assert program.argnums == (1,)
    assert program.placed == (("replicated", "state", "batch"), (1,))


def test_the_train_declarations_place_as_the_positional_layout_did():
    for accum, block in ((1, "block"), (4, "accum_block")):
        for kind in (TRAIN_STEP, MANUAL_STEP):
            program = kind.running({}, layout=train_layout(accum))
            assert program.argnums == (2, 4)  # the Weights and the accumulator
            assert program.placed == (
                ("replicated", "replicated", "state", "replicated", "state", block)
                + ("replicated",) * 5,
                (2, "replicated", 4, "replicated", "replicated"),
            )
    assert EVAL_FORWARD.placed == (("replicated", "state", "replicated", "batch"), None)
    for kind in (EVAL_METRICS, EVAL_LOSS):
        assert kind.argnums == ()
        assert kind.placed == (("replicated",) * 3, ("replicated",))


@pytest.mark.parametrize(
    ("kw", "where", "name"),
    [
        ({"donate": ("weight",)}, "donate", "weight"),
        ({"layout": Layout({"params": "state"})}, "layout", "params"),
        ({"layout": Layout(outputs=(Like("state"),))}, "layout", "state"),
    ],
)
def test_a_name_that_is_no_field_of_the_arguments_is_refused(kw, where, name):
    with pytest.raises(
        NitroError,
        match=rf"Program 'demo' names '{name}' in its {where}, but its arguments "
        r"\(Args\) have no such field; they are values, weights, batch",
    ):
        declared(**kw)


def test_an_executable_refuses_arguments_of_another_type():
    given = r"Program 'demo' takes its arguments as Args; it was given a tuple\."
    with pytest.raises(NitroError, match=given):
        declared().executable(None, None, (1, 2, 3), ())


def test_every_constant_of_the_declaration_moves_the_one_key():
    base = declared(donate=("weights",), baked={"mode": "eval"})
    moved = [
        base.running({"mode": "train"}),
        base.running({"scale": 1}),
        base.running({}, traced=("forward",)),
        base.running({}, layout=Layout({"batch": "batch"})),
        declared(baked={"mode": "eval"}),  # donates nothing
    ]
    keys = {base.memo(()), *(program.memo(()) for program in moved)}
    assert len(keys) == len(moved) + 1
    assert base.running({}).memo(()) == base.memo(())
    # Typed: values Python calls equal but a trace bakes apart key apart.
    assert base.running({"scale": 1}).key != base.running({"scale": 1.0}).key
    # The cache key's constants are the same declaration's.
    assert base.constants() == {"mode": "eval", "donate": (1,), "roles": base.placed}
