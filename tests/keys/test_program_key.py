"""The compile cache's key: values Python calls equal key apart if they trace apart."""

import dataclasses

import numpy as np

from jaxnitro.keys.program_key import ProgramKey, typed_key


def test_typed_key_tells_apart_values_python_calls_equal():
    @dataclasses.dataclass(frozen=True)
    class Cfg:
        width: float

    for a, b in [
        ((1, 2), (True, 2.0)),
        (0.0, -0.0),
        (frozenset({1}), frozenset({1.0})),
        ({"a": 1}, {"a": True}),
        (Cfg(1), Cfg(1.0)),
        (np.float32(1.0), 1.0),
    ]:
        assert a == b and typed_key(a) != typed_key(b)
    assert typed_key((1, (2.0, "x"))) == typed_key((1, (2.0, "x")))
    assert typed_key(float("nan")) == typed_key(float("nan"))


def test_baked_constants_key_with_their_types():
    def key(baked):
        return ProgramKey(
            kind="gradient",
            experiment=("m", "E"),
            graphconst=(),
            code="",
            model=None,
            signature=(),
            baked=baked,
            compile_options=(),
        )

    assert key((("inv_accum", 1.0),)) == key((("inv_accum", 1.0),))
    assert key((("inv_accum", 1.0),)) != key((("inv_accum", 1),))
    assert key((("clip", 0.0),)) != key((("clip", -0.0),))
