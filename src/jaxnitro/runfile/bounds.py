"""The ranges a run file's numbers must stay in, and the checks that hold them.

A run file is untrusted input, so every number is bounded before anything is
built from it:

- the language's numbers: integers fit in 64 bits (`INT_MIN` .. `INT_MAX`) and
  floats are finite, both as written (E-READ-013, the reader) and as computed by
  `+ - * / min max` (E-EVAL-019);
- each field's own range, checked where the field is read (E-EVAL-007): a seed
  JAX's keys tell apart, steps and cadence blocks a run can plan, batch sizes it
  can allocate;
- each model size (E-SHAPE-012): a `gpt`'s layers, width, vocabulary and context,
  a layer's features, and the parameter elements of the whole model.

Example:
    >>> is_finite_number(1.5), is_finite_number(float("nan")), is_finite_number(2**64)
    (True, False, False)
"""

from __future__ import annotations

import math
from typing import Any

from .source import RunfileError, Span, fail

INT_MAX = 2**63 - 1
"""The largest integer of the language (a signed 64-bit one)."""
INT_MIN = -(2**63)
"""The smallest integer of the language."""

SEED_MAX = 2**32 - 1
"""The largest seed: JAX's keys take 32 bits of a seed, so 2**32 and 0 would draw
the same parameters."""
STEPS_MAX = 100_000_000
"""The most optimizer steps a run plans (ten times the longest runs trained)."""
BLOCKS_MAX = 1_000_000
"""The most cadence blocks (steps / cadence): each is an engine epoch, planned up
front."""
MICROBATCHES_MAX = 65_536
"""The most micro-batches one optimizer step accumulates."""
BATCH_SIZE_MAX = 1_048_576
"""The most records one batch holds."""
BATCH_ELEMENTS_MAX = 2**31 - 1
"""The most elements one field of one batch holds (batch size x its shape)."""


LAYERS_MAX = 1024
"""The most blocks a `gpt` has (the deepest trained transformers have ~100)."""
WIDTH_MAX = 65_536
"""The widest `gpt` or `embedding` (:dim): 8x the widest trained models."""
VOCAB_MAX = 4_194_304
"""The largest vocabulary (:vocab), and the most features a layer takes or gives
(`linear`, `mlp`, `layer-norm`): 16x the largest vocabularies in use."""
CONTEXT_MAX = 1_048_576
"""The longest `gpt` context (:context), in positions."""
PARAMETERS_MAX = 2**40
"""The most parameter elements a model has (4 TiB of float32)."""
MODEL_BOUNDS = {
    "layers": LAYERS_MAX,
    "dim": WIDTH_MAX,
    "vocab": VOCAB_MAX,
    "context": CONTEXT_MAX,
    "heads": WIDTH_MAX,
    "in": VOCAB_MAX,
    "out": VOCAB_MAX,
}
"""The bound of each size argument of the models and layers (E-SHAPE-012);
`layer-norm`'s :dim and `mlp`'s :dims are bounded by `VOCAB_MAX`."""


def is_finite_number(value: Any) -> bool:
    """Whether `value` is a number of the language: an int in 64 bits, or a finite
    float (a bool is not a number)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return INT_MIN <= value <= INT_MAX
    return isinstance(value, float) and math.isfinite(value)


def check_result(value: Any, what: str, span: Span) -> Any:
    """`value`, computed by `what`, when it is a number of the language or not a
    Python number at all (an array inside `prepare`); else E-EVAL-019."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return value
    if is_finite_number(value):
        return value
    shown = "an integer beyond 64 bits" if isinstance(value, int) else str(value)
    raise fail(
        "E-EVAL-019",
        f"`{what}` gives {shown}: the run file's numbers are 64-bit integers and "
        "finite floats",
        span,
        "keep the values in range: a learning rate, a size or a step count never "
        "needs more",
    )


def in_range(
    value: int, what: str, low: int, high: int, span: Span, why: str = ""
) -> int:
    """`value` when `low <= value <= high`, else E-EVAL-007 naming the field, the
    value and the range (and `why` the bound is there)."""
    if low <= value <= high:
        return value
    raise out_of_range(value, what, low, high, span, why)


def out_of_range(
    value: Any, what: str, low: int, high: int, span: Span, why: str = ""
) -> RunfileError:
    """E-EVAL-007 for `value` of `what` outside `low .. high`."""
    return fail(
        "E-EVAL-007",
        f"{what} is {value}, outside {low} .. {high}" + (f": {why}" if why else ""),
        span,
        f"give {what} a value from {low} to {high}",
    )


def model_size(value: int, what: str, bound: int, span: Span) -> int:
    """`value` of the model size `what` when at most `bound`, else E-SHAPE-012
    naming the argument, the value and the bound."""
    if value <= bound:
        return value
    raise fail(
        "E-SHAPE-012",
        f"{what} is {value}, over the bound of {bound}: no machine trains a model "
        "of that size",
        span,
        f"use at most {bound}",
    )
