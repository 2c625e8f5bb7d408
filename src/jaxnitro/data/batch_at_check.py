"""`check_batch_at`: verify a source's fan-out trait against its own iteration.

A `batch_at` in the wrong index units trains without an error: batch `i` built from
SAMPLE `i` gives each epoch overlapping windows over the first few hundred samples,
and the loss still falls. This check needs no accelerator, so it belongs in a model
package's test suite:

    >>> import numpy as np
    >>> class Loader:
    ...     def __init__(self, x, bs):
    ...         self.x, self.bs = x, bs
    ...     def __len__(self):
    ...         return len(self.x) // self.bs
    ...     def _build(self, start):
    ...         return {"x": self.x[start : start + self.bs]}
    ...     def begin_epoch(self):
    ...         return None
    ...     def batch_at(self, k, plan=None):
    ...         return self._build(k)  # WRONG: k is a batch index, not a sample
    ...     def __iter__(self):
    ...         self.begin_epoch()
    ...         return (self._build(k * self.bs) for k in range(len(self)))
    >>> check_batch_at(Loader(np.arange(12.0), 4))
    Traceback (most recent call last):
    ...
    jaxnitro.errors.ConfigError: batch_at of Loader looks like it takes a SAMPLE ...
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..experiment.routing import as_batch
from .grain_adapter import as_indexed
from .protocol import (
    begin_epoch_checked,
    call_batch_at,
    missing_trait_methods,
    unwrap_source,
)

_HINT = "batch_at must return a dict such as {'img': array, 'label': array}."
_UNITS = (
    " `i` is a BATCH index in range(len(source)): batch_at(i) builds the samples "
    "[i * batch_size, (i + 1) * batch_size) of the epoch's order, not the window "
    "starting at sample i."
)
_OFFSETS = (
    "batch_at of {kind} looks like it takes a SAMPLE offset: batch_at(1) is "
    "batch_at(0) shifted by one sample, so consecutive batches overlap.{units}"
)
_PLAN = (
    "batch_at of {kind} ignores the plan it is passed: batch_at({i}, plan) returned "
    "different contents for the same i and plan after begin_epoch drew the next "
    "plan. It reads state begin_epoch replaced (or draws its own randomness); build "
    "the batch from `i` and `plan` only, so every worker thread sees the same epoch."
)


def _seek(source: Any) -> None:
    seek = getattr(source, "set_epoch", None)
    if callable(seek):
        seek(0)


def _same(a: Any, b: Any) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.kind in "fc":
        return bool(np.array_equal(a, b, equal_nan=True))
    return bool(np.array_equal(a, b))


def _shifted(first: Mapping[str, Any], second: Mapping[str, Any]) -> bool:
    """Whether `second` is `first` moved along by one sample (sample offsets)."""
    varied = False
    for name in first:
        a, b = np.asarray(first[name]), np.asarray(second.get(name))
        if a.ndim == 0 or a.shape != b.shape or a.shape[0] < 2:
            return False
        if not _same(b[:-1], a[1:]):
            return False
        varied = varied or not _same(a[:-1], a[1:])
    return varied


def _describe(batch: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}: {np.shape(v)}" for k, v in batch.items())


def check_batch_at(source: Any, *, values: bool = False) -> None:
    """Assert that `batch_at` agrees with the source's own `iter()`, batch for batch.

    Compares, for every `i`, the field names and sizes of `batch_at(i, plan)` with
    the `i`-th batch of `iter(source)`, and catches a `batch_at` that takes sample
    offsets. `values=True` also compares contents, and checks that `batch_at`
    depends only on `i` and the plan; it needs a deterministic source (one whose
    two passes draw the same plan, or that has `set_epoch`, which both passes use to
    read epoch 0). A `grain.MapDataset` is checked through its adapter. Raises
    `ConfigError` naming the first disagreement.
    """
    source = as_indexed(unwrap_source(source))
    kind = type(source).__name__
    missing = missing_trait_methods(source)
    if missing:
        raise ConfigError(
            f"check_batch_at: {kind} lacks {' and '.join(missing)}, so it has no "
            f"fan-out trait to check. Define begin_epoch(self) -> plan and "
            f"batch_at(self, i, plan=None) -> batch."
        )
    _seek(source)
    reference = [as_batch(b, _HINT) for b in source]
    _seek(source)
    plan = begin_epoch_checked(source, kind)
    count = len(source)
    got = []
    for i in range(count):
        batch = call_batch_at(source, i, plan)
        if batch is None:
            raise ConfigError(
                f"check_batch_at: batch_at({i}) of {kind} returned None; it must "
                f"return a batch for every i in range(len(source)) = range({count})."
            )
        got.append(as_batch(batch, _HINT))
    if count >= 2 and _shifted(got[0], got[1]):
        raise ConfigError(_OFFSETS.format(kind=kind, units=_UNITS))
    if len(reference) != count:
        raise ConfigError(
            f"check_batch_at: iter() of {kind} yielded {len(reference)} batches, but "
            f"len() is {count} after begin_epoch. len() must count the batches of "
            f"one epoch."
        )
    for i, (want, have) in enumerate(zip(reference, got, strict=True)):
        if set(want) != set(have):
            raise ConfigError(
                f"check_batch_at: batch {i} of {kind} has fields "
                f"{sorted(have)} from batch_at but {sorted(want)} from iter()."
            )
        for name in want:
            same_size = np.shape(want[name]) == np.shape(have[name])
            if not same_size or (values and not _same(want[name], have[name])):
                what = "shape" if not same_size else "contents"
                raise ConfigError(
                    f"check_batch_at: batch {i} of {kind} differs in the {what} of "
                    f"field `{name}`: batch_at gives ({_describe(have)}), iter() "
                    f"gives ({_describe(want)}).{_UNITS}"
                )
    if values and plan is not None:
        begin_epoch_checked(source, kind)
        for i in range(count):
            again = as_batch(call_batch_at(source, i, plan), _HINT)
            if any(not _same(again[k], got[i][k]) for k in got[i]):
                raise ConfigError(_PLAN.format(kind=kind, i=i))
