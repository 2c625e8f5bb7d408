"""The evaluator: the forms, keyword calls, require, and no escape to Python."""

from __future__ import annotations

import inspect
import sys

import pytest

from jaxnitro.runfile.evaluator import evaluate_file
from jaxnitro.runfile.source import RunfileError
from jaxnitro.runfile.values import Keyword


def value(write, text: str, name: str = "x"):
    return evaluate_file(write(text)).value(name)


def codes(write, text: str) -> tuple[list[str], str]:
    with pytest.raises(RunfileError) as caught:
        evaluate_file(write(text))
    return caught.value.codes, str(caught.value)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("(defvar x (+ 1 2 3))", 6),
        ("(defvar x (/ 1 4))", 0.25),
        ("(defvar x (- 5))", -5),
        ("(defvar x (* 2 (max 1 3) (min 4 5)))", 24),
        ("(defvar x (< 1 2 3))", True),
        ("(defvar x (if (>= 1 2) :a :b))", Keyword("b")),
        ("(defvar x (cond ((= 1 2) 1) ((not false) 2) (true 3)))", 2),
        ("(defvar x (let ((a 2) (b (* a 3))) (+ a b)))", 8),
        ("(defun f (a b) (- a b))\n(defvar x (f 5 2))", 3),
        ("(defvar g (fn (a) (* a a)))\n(defvar x (g 7))", 49),
        ("(defvar x (list :a 1 [2 nil]))", (Keyword("a"), 1, (2, None))),
        ("(defvar x (and true (< 1 2)))", True),
        ("(defvar x (or nil false))", False),
    ],
)
def test_forms_evaluate(write, text, expected):
    assert value(write, text) == expected


def test_a_closure_sees_its_defining_scope_and_recursion_is_bounded(write):
    text = "(defun f (n) (if (= n 0) 0 (+ 1 (f (- n 1)))))\n(defvar x (f 50))"
    assert value(write, text) == 50
    found, message = codes(write, "(defun f (n) (f n))\n(defvar x (f 1))")
    assert found == ["E-EVAL-013"] and "deeper than 200" in message


def test_keyword_arguments_and_their_near_names(write):
    text = '(require "sexpgpu/optim" sgd)\n(defvar x (sgd :lr 0.5 :momentun 0.9))'
    found, message = codes(write, text)
    assert found == ["E-EVAL-005"]
    assert "`sgd` has no keyword `:momentun`" in message
    assert "did you mean `:momentum`?" in message
    assert ":2:24: E-EVAL-005" in message  # the keyword's own position


@pytest.mark.parametrize(
    "text, code, needle",
    [
        ("(defvar x y)", "E-EVAL-001", "`y` is not defined"),
        ("(defvar lenght 1)\n(defvar x length)", "E-EVAL-001", "did you mean `lenght`"),
        ("(defvar x (1 2))", "E-EVAL-003", "not a function"),
        ("(defun f (a) a)\n(defvar x (f 1 2))", "E-EVAL-004", "takes 1 argument"),
        ('(require "sexpgpu/optim" sgd)\n(defvar x (sgd))', "E-EVAL-006", "needs :lr"),
        ('(defvar x (+ 1 "a"))', "E-EVAL-007", "works on numbers"),
        ("(defvar x (if 1 2 3))", "E-EVAL-007", "a condition must be"),
        ('(require "sexpgpu/mm" gpt)', "E-EVAL-008", "did you mean `sexpgpu/nn`"),
        (
            '(require "sexpgpu/nn" gtp)',
            "E-EVAL-009",
            "exports cross-entropy embedding gpt",
        ),
        ("(defvar x (/ 1 0))", "E-EVAL-014", "division by zero"),
        ("(defvar x (let (a 1) a))", "E-EVAL-015", "a let binding is"),
        ("(defvar x 1)\n(defvar x 2)", "E-EVAL-016", "already defined at line 1"),
        ("(defvar x (defvar y 1))", "E-EVAL-017", "only at the top level"),
        ("(defvar x ())", "E-EVAL-015", "empty list"),
    ],
)
def test_evaluation_errors_are_coded(write, text, code, needle):
    found, message = codes(write, text)
    assert found == [code]
    assert needle in message


@pytest.mark.parametrize(
    "text, code",
    [
        ('(defvar x (import "os"))', "E-EVAL-002"),
        ('(defvar x (open "/etc/passwd"))', "E-EVAL-002"),
        ('(defvar x (exec "print(1)"))', "E-EVAL-002"),
        ('(defvar x (eval "1"))', "E-EVAL-002"),
        ("(defvar x (__import__ 1))", "E-EVAL-002"),
        ('(defvar x (getattr 1 "__class__"))', "E-EVAL-002"),
        ('(require "os" path)', "E-EVAL-010"),
        ('(require "subprocess.py" run)', "E-EVAL-010"),
        ('(require "/etc/passwd" root)', "E-EVAL-010"),
        ('(require "missing.sx" f)', "E-EVAL-011"),
        ('(defvar x (files ["http://example.com/data.jsonl"]))', "E-LOAD-001"),
    ],
)
def test_a_run_file_cannot_escape_to_python(write, text, code):
    found, message = codes(write, text)
    assert found == [code], message


def test_require_a_library_imports_only_the_listed_names(write):
    write(
        "(defvar warmup 5)\n(defun double (x) (* 2 x))\n(defvar hidden 1)",
        "lib/common.sx",
    )
    path = write('(require "lib/common.sx" double warmup)\n(defvar x (double warmup))')
    result = evaluate_file(path)
    assert result.value("x") == 10
    assert "hidden" not in result.scope.names and "double" not in result.defined
    found, message = codes(write, '(require "lib/common.sx" tripple)')
    assert found == ["E-EVAL-009"] and "exports double hidden warmup" in message


def test_a_library_requiring_itself_is_refused(write):
    write('(require "b.sx" y)\n(defvar x 1)', "a.sx")
    write('(require "a.sx" x)\n(defvar y 1)', "b.sx")
    found, message = codes(write, '(require "a.sx" x)')
    assert found == ["E-EVAL-012"] and "requires itself" in message


def test_evaluated_once_in_order(write):
    found, _ = codes(write, "(defvar x y)\n(defvar y 1)")
    assert found == ["E-EVAL-001"]


def test_a_recursion_that_exhausts_the_stack_before_the_call_limit_is_coded(write):
    # Each call nests lets and an argument: Python's stack runs out before 200
    # calls. The stack left is set here: how many frames a call takes, and the
    # limit itself, differ between Python versions and machines.
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(len(inspect.stack(0)) + 400)
    try:
        _recursion_is_coded(write)
    finally:
        sys.setrecursionlimit(limit)


def _recursion_is_coded(write):
    text = "(defun f (n) (let ((a (+ 1 (let ((b (f n))) b)))) a))\n(defvar x (f 1))"
    found, message = codes(write, text)
    assert found == ["E-EVAL-013"]
    assert ":2:11: E-EVAL-013 calls nested too deeply (in `f`)" in message
