"""ExportSpec's own checks, and the rules each export hook applies to its specs."""

import numpy as np
import pytest

import jaxnitro as nx
from jaxnitro.export.spec import check_specs


def test_spec_fields_are_normalised():
    spec = nx.ExportSpec("img", np.uint8, [1, 4, 5], axis_letters=["h", "w"])
    assert spec.dtype == np.dtype("uint8")
    assert spec.shape == (1, 4, 5)
    assert spec.axis_letters == ("h", "w")
    assert spec.source == "img"
    assert nx.ExportSpec("out", from_="logits").source == "logits"
    assert spec.as_json() == {
        "name": "img",
        "dtype": "uint8",
        "shape": [1, 4, 5],
        "batch_axis": 0,
        "axis_letters": "hw",
    }


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": ""}, "name must be a non-empty string"),
        ({"name": "x", "dtype": "floaty"}, r"dtype='floaty' is not a dtype NumPy"),
        ({"name": "x", "dtype": "float32", "shape": (1, 0)}, r"sizes >= 1"),
        (
            {"name": "x", "dtype": "float32", "shape": (1, 2), "batch_axis": 2},
            "outside",
        ),
        ({"name": "x", "shape": (1, 2, 3), "axis_letters": "h"}, "names 1 axes"),
        ({"name": "x", "axis_letters": ["hw"]}, "one letter per non-batch axis"),
        ({"name": "x", "from_": ""}, "from_='' must be a non-empty string"),
        (
            {"name": "x", "nonfinite": "ignore"},
            r"ExportSpec\('x'\): nonfinite='ignore' must be 'refuse' .* or 'allow'",
        ),
    ],
)
def test_spec_refuses_bad_fields(kwargs, message):
    with pytest.raises(nx.ConfigError, match=message):
        nx.ExportSpec(**kwargs)


def test_inputs_need_dtype_shape_batch_first_and_fixed_sizes():
    with pytest.raises(
        nx.HookError, match=r"export_inputs: ExportSpec\('x'\) needs a dtype"
    ):
        check_specs("export_inputs", [nx.ExportSpec("x")])
    with pytest.raises(nx.HookError, match="batch_axis=1; the exported program"):
        check_specs(
            "export_inputs", [nx.ExportSpec("x", "float32", (8, 1), batch_axis=1)]
        )
    with pytest.raises(nx.HookError, match=r"variable \(-1\) axis"):
        check_specs("export_inputs", [nx.ExportSpec("x", "float32", (1, -1))])
    with pytest.raises(nx.HookError, match="only export_outputs accepts"):
        check_specs("export_inputs", [nx.ExportSpec("x", "float32", (1, 2), from_="y")])


def test_only_inputs_may_allow_nonfinite_values():
    allowed = nx.ExportSpec("x", "float32", (1, 2), nonfinite="allow")
    assert check_specs("export_inputs", [allowed])[0].nonfinite == "allow"
    assert nx.ExportSpec("x").nonfinite == "refuse"  # the default
    for hook in ("export_outputs", "export_client_inputs"):
        with pytest.raises(
            nx.HookError,
            match=rf"{hook}: ExportSpec\('x'\) has nonfinite='allow', which only "
            "export_inputs accepts",
        ):
            check_specs(hook, [allowed])


def test_hook_returns_are_checked_as_a_whole():
    with pytest.raises(
        nx.HookError, match="must return a non-empty list of ExportSpec"
    ):
        check_specs("export_outputs", [])
    with pytest.raises(nx.HookError, match="returned a str"):
        check_specs("export_outputs", ["logits"])
    with pytest.raises(nx.HookError, match="declares 'y' twice"):
        check_specs("export_outputs", [nx.ExportSpec("y"), nx.ExportSpec("y")])
    with pytest.raises(nx.HookError, match="only one of dtype and shape"):
        check_specs("export_outputs", [nx.ExportSpec("y", "float32")])


def test_client_specs_allow_variable_axes_and_any_batch_axis_but_need_both():
    specs = check_specs(
        "export_client_outputs",
        [nx.ExportSpec("label", "int32", (-1, 1), batch_axis=1, axis_letters="k")],
    )
    assert specs[0].shape == (-1, 1)
    with pytest.raises(nx.HookError, match="cannot derive them"):
        check_specs("export_client_inputs", [nx.ExportSpec("img", "uint8")])


def test_required_hooks_raise_naming_the_fix_and_optional_ones_default():
    from experiments import Tiny

    e = Tiny()
    with pytest.raises(nx.HookError, match=r"needs Tiny.export_inputs.*Define it"):
        e.export_inputs()
    with pytest.raises(nx.HookError, match=r"needs Tiny.export_outputs.*Define it"):
        e.export_outputs()
    assert e.export_preprocess(np.zeros(1)) is None
    assert e.export_postprocess() is None
    assert e.export_client_inputs() is None
    assert e.export_client_outputs() is None
    assert e.export_provenance_extra(checkpoint="c.safetensors") == {}
