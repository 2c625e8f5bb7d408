"""The contract (every error at once) and knobs, variants, sweeps, order rules."""

from __future__ import annotations

import pytest

from jaxnitro.runfile.check import check_file, evaluate_checked
from jaxnitro.runfile.knobs import Selection
from jaxnitro.runfile.source import RunfileError

from .conftest import MINIMAL


def errors(path: str, selection: Selection | None = None) -> RunfileError:
    with pytest.raises(RunfileError) as caught:
        check_file(path, selection)
    return caught.value


def without(text: str, line_start: str) -> str:
    return "\n".join(
        line for line in text.split("\n") if not line.startswith(line_start)
    )


def test_the_minimal_example_holds(write):
    assert evaluate_checked(write(MINIMAL)).run.steps == 20


def test_every_contract_error_is_reported_in_one_run(write):
    text = (
        without(MINIMAL, "(defvar optimizer")
        .replace(
            "(defun objective (prediction targets)",
            "(defvar objective 3)\n(defun unused (prediction targets)",
        )
        .replace("(defvar model (gpt", "(defvar model (list")
    )
    error = errors(write(text))
    assert error.codes == ["E-CONTRACT-002", "E-CONTRACT-002", "E-CONTRACT-001"]
    message = str(error)
    assert "`model` is a list; the contract wants a model" in message
    assert "`objective` is an integer; the contract wants a function of 2" in message
    assert "missing `optimizer`" in message and "(defvar optimizer (sgd" in message


def test_a_function_of_the_wrong_arity_is_the_wrong_kind(write):
    text = MINIMAL.replace("(defun prepare (batch)", "(defun prepare (batch extra)")
    error = errors(write(text))
    assert error.codes == ["E-CONTRACT-002"]
    assert "a function of 2 arguments; the contract wants a function of 1" in str(error)


def test_missing_defrun_and_evaluate_with_a_pass(write):
    text = without(MINIMAL, "(defrun").replace(
        "(defun prepare",
        "(defeval valid :loader train-loader :every 5)\n\n(defun prepare",
    )
    error = errors(write(text))
    assert error.codes == ["E-CONTRACT-001", "E-CONTRACT-001"]
    assert "missing `evaluate` (the file has an evaluation pass)" in str(error)


def test_a_library_defining_model_gives_the_run_none(write):
    write(
        '(require "sexpgpu/nn" gpt)\n(defvar model (gpt :vocab 8 :layers 1 '
        ":dim 8 :heads 1))",
        "lib.sx",
    )
    text = '(require "lib.sx" model)\n' + without(MINIMAL, "(defvar model")
    text = text.replace('(require "lib.sx" model)\n', "", 1).replace(
        '(require "sexpgpu/optim" sgd)',
        '(require "sexpgpu/optim" sgd)\n(require "lib.sx" model)',
    )
    error = errors(write(text))
    assert error.codes == ["E-CONTRACT-001"] and "missing `model`" in str(error)


KNOBS = """(require "sexpgpu/nn" cross-entropy gpt)
(require "sexpgpu/optim" sgd)

(defvariant small (layers 1))

(defknobs
  (layers 2 "blocks")
  (lr 0.5 "learning rate")
  (mode :fast "a keyword knob"))

(defsweep grid (layers [1 2]) (lr [0.1 0.2 0.3]))
""" + MINIMAL.split('(require "sexpgpu/optim" sgd)\n')[1].replace(
    ":layers 2", ":layers layers"
).replace("(sgd :lr 0.5)", "(sgd :lr lr)")


def test_knobs_variants_sets_and_sweeps(write):
    path = write(KNOBS)
    assert check_file(path).parameters == 32
    assert check_file(path, Selection(variant="small")).parameters == 18
    assert check_file(path, Selection(sets=(("layers", "3"),))).parameters == 46
    result = evaluate_checked(path, Selection(sets=(("lr", "1"),)))
    assert result.value("lr") == 1.0 and isinstance(result.value("lr"), float)
    points = result.knobs.points("grid")
    assert len(points) == 6 and points[0] == (("layers", 1), ("lr", 0.1))
    assert check_file(path, Selection(point=points[0])).parameters == 18


@pytest.mark.parametrize(
    "selection, code, needle",
    [
        (
            Selection(sets=(("layers", "2.5"),)),
            "E-KNOB-002",
            "knob `layers` is an integer",
        ),
        (Selection(sets=(("lr", "fast"),)), "E-KNOB-002", "'fast' is not"),
        (Selection(sets=(("mode", "3"),)), "E-KNOB-002", "the keyword :fast"),
        (Selection(sets=(("layer", "3"),)), "E-KNOB-003", "did you mean `layers`"),
        (Selection(variant="smal"), "E-KNOB-004", "did you mean `small`"),
    ],
)
def test_knob_selection_errors(write, selection, code, needle):
    error = errors(write(KNOBS), selection)
    assert error.codes == [code] and needle in str(error)


def test_an_unknown_sweep_is_refused(write):
    result = evaluate_checked(write(KNOBS))
    with pytest.raises(RunfileError, match="E-KNOB-005 no sweep `grd`"):
        result.knobs.points("grd")


@pytest.mark.parametrize(
    "edit, code, needle",
    [
        (
            ("(defvariant small (layers 1))", "(defvariant small (layer 1))"),
            "E-KNOB-001",
            "did you mean `layers`",
        ),
        (
            ("(defvariant small (layers 1))", "(defvariant small (layers 1.5))"),
            "E-KNOB-002",
            "the variant's value 1.5",
        ),
        (
            ("(defsweep grid (layers [1 2])", "(defsweep grid (layers [1 :a])"),
            "E-KNOB-002",
            "a swept value",
        ),
        (
            ('(layers 2 "blocks")', '(layers 2 "blocks")\n  (layers 3 "again")'),
            "E-KNOB-006",
            "declared twice",
        ),
        (("(defvariant small (layers 1))\n", ""), None, None),
    ],
)
def test_variant_and_sweep_declaration_errors(write, edit, code, needle):
    path = write(KNOBS.replace(*edit))
    if code is None:
        assert check_file(path).parameters == 32
        return
    error = errors(path)
    assert error.codes == [code] and needle in str(error)


@pytest.mark.parametrize(
    "edit, code",
    [
        (
            (
                "(defvariant small (layers 1))",
                '(defvariant small (layers 1))\n(require "sexpgpu/nn" gpt)',
            ),
            "E-ORDER-001",
        ),
        (
            ("(defsweep grid", "(defvariant late (layers 1))\n(defsweep grid"),
            "E-ORDER-002",
        ),
        (
            ("(defvariant small (layers 1))", "(defsweep early (layers [1]))"),
            "E-ORDER-003",
        ),
    ],
)
def test_order_rules(write, edit, code):
    error = errors(write(KNOBS.replace(*edit)))
    assert error.codes == [code]


def test_contract_names_in_the_spec_order(write):
    text = MINIMAL.replace("(defvar optimizer (sgd :lr 0.5))\n", "").replace(
        "(defvar train-loader",
        "(defvar optimizer (sgd :lr 0.5))\n\n(defvar train-loader",
    )
    error = errors(write(text))
    assert error.codes == ["E-ORDER-004"]
    assert "`train-loader` comes after `optimizer` (line 6)" in str(error)


def test_a_misspelled_call_in_a_body_is_reported_beside_a_missing_optimizer(write):
    # The case: the body of objective is never called (the optimizer is
    # missing), and its misspelled call is reported all the same, where it is.
    text = without(MINIMAL, "(defvar optimizer").replace(
        "(cross-entropy prediction targets)", "(cross-entropi prediction targets)"
    )
    error = errors(write(text))
    assert error.codes == ["E-EVAL-001", "E-CONTRACT-001"]
    first = str(error).split("\n")
    assert first[0].endswith(":18:40: E-EVAL-001 `cross-entropi` is not defined")
    assert first[2] == "  " + " " * 39 + "^" + "~" * 12
    assert "did you mean `cross-entropy`?" in str(error)
    assert "missing `optimizer`" in str(error)


def test_every_failed_form_is_reported_once_and_its_uses_are_not(write):
    text = MINIMAL.replace(
        "(defvar model",
        "(defvar width (* 16 undefined-a))\n"
        "(defvar height (+ width 1))\n"  # uses a failed name: not reported again
        "(defun helper (x) (let ((y x)) (fn (z) (+ x y z undefined-b))))\n"
        "(defvar model",
    ).replace("(sgd :lr 0.5)", "(sgd :lr 0.5 :momentun 0.9)")
    error = errors(write(text))
    assert error.codes == ["E-EVAL-001", "E-EVAL-001", "E-EVAL-005"]
    message = str(error)
    assert "`undefined-a` is not defined" in message
    assert "`undefined-b` is not defined" in message  # inside fn, never called
    assert "`width`" not in message and "`x`" not in message and "`z`" not in message
    assert "`sgd` has no keyword `:momentun`" in message


def test_shapes_are_traced_beside_contract_errors(write):
    text = without(MINIMAL, "(defvar optimizer").replace(
        "(slice tokens 1 0 16)", "(slice tokens 1 0 18)"
    )
    error = errors(write(text))
    assert error.codes == ["E-SHAPE-004", "E-CONTRACT-001"]
    assert ":14:19: E-SHAPE-004 (slice x 1 0 18)" in str(error).split("\n")[0]


def test_a_failed_defknobs_does_not_report_its_knobs_as_undeclared(write):
    text = KNOBS.replace('(layers 2 "blocks")', '(layers 2 "blocks")\n  (lr)')
    error = errors(write(text))
    assert error.codes == ["E-KNOB-008"]


def test_a_form_out_of_order_is_reported_once(write):
    text = MINIMAL.replace("(defvar optimizer (sgd :lr 0.5))\n", "").replace(
        "(defvar train-loader",
        "(defvar optimizer (sgd :lr 0.5))\n\n(defvar train-loader",
    )
    text = text.replace("(defun prepare (batch)", "(defun prepare (batch)\n  (bogus)")
    error = errors(write(text))
    assert error.codes == ["E-ORDER-004", "E-EVAL-001"]
