"""`Average`: the parameters of several checkpoints of one run, averaged.

`Average(sel)` is a weights source (`weights=(run, Average(Last(10)))`) and a
`restore_best` value. The picked records must share one parameter tree; parameters
(and the EMA, when every pick has one) are averaged leaf for leaf in float64
(complex128 for a complex leaf) and cast back to their dtype, bfloat16 included. The
model state and the derived Device values are not averaged: they come from one pick,
the best when the selector ranks and the latest otherwise, or as `state="best" |
"latest"` says. That is exact for a model without running statistics and an
approximation for one with them (BatchNorm). The optimizer starts fresh, so an
averaged record holds no optimizer state.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp
import numpy as np

from ..errors import CheckpointError, ConfigError
from .header import RecordHeader
from .manifest import ManifestEntry
from .record import CheckpointRecord
from .selectors import Best, Epochs, Every, Last, is_selector

WEIGHTS = ("uniform",)
STATE_FROM = (None, "best", "latest")
_AVERAGED = ("params/", "ema/")


@dataclass(frozen=True)
class Average:
    """The average of the checkpoints `selector` picks from one run.

    Args:
        selector: which checkpoints, e.g. `Last(10)` or `Best(5, among=Last(20))`.
        weight: "uniform", the only weighting so far.
        state: where the model state comes from: None (the best pick when the
            selector ranks, else the latest), "best" or "latest".

    Examples:
        >>> Average(Last(10))
        Average(selector=Last(n=10), weight='uniform', state=None)
    """

    selector: Any
    weight: str = "uniform"
    state: str | None = None

    def __post_init__(self) -> None:
        if not is_selector(self.selector) or isinstance(self.selector, Average):
            raise ConfigError(
                f"Average(selector) takes a selector such as Last(10) or "
                f"Best(5, among=Last(20)); got {self.selector!r}."
            )
        if self.weight not in WEIGHTS:
            raise ConfigError(
                f'Average(weight={self.weight!r}): "uniform" is the only weighting '
                f"so far."
            )
        if self.state not in STATE_FROM:
            raise ConfigError(
                f"Average(state={self.state!r}): it is None (the best pick when the "
                f'selector ranks, else the latest), "best" or "latest".'
            )

    @property
    def state_from(self) -> str:
        """ "best" or "latest": which pick supplies the model state."""
        if self.state is not None:
            return self.state
        return "best" if getattr(self.selector, "ranks", False) else "latest"


def expected_count(selector: Any) -> int | None:
    """How many checkpoints `selector` picks from a long enough run, when known."""
    if isinstance(selector, Last):
        return selector.n
    if isinstance(selector, Best):
        inner = None if selector.among is None else expected_count(selector.among)
        return selector.k if inner is None else min(selector.k, inner)
    if isinstance(selector, Epochs):
        return len(selector.epochs)
    return None


def keep_holds(keep: Sequence[Any], selector: Any) -> bool | None:
    """Whether retention under `keep` always holds what `selector` picks.

    None when that cannot be told (a custom selector).
    """
    if isinstance(selector, Last):
        return any(isinstance(s, Last) and s.n >= selector.n for s in keep)
    if isinstance(selector, Best):
        if selector.among is not None:
            return keep_holds(keep, selector.among)
        return any(isinstance(s, Best) and s.k >= selector.k for s in keep)
    if isinstance(selector, Every):
        return any(isinstance(s, Every) and selector.n % s.n == 0 for s in keep)
    if isinstance(selector, Epochs):
        return any(
            isinstance(s, Epochs) and set(selector.epochs) <= set(s.epochs)
            for s in keep
        ) or any(
            isinstance(s, Every) and all(e % s.n == 0 for e in selector.epochs)
            for s in keep
        )
    return None


def keep_for(selector: Any) -> Any:
    """The selector a keep holds `selector`'s picks with (keep refuses `among`)."""
    if isinstance(selector, Best) and selector.among is not None:
        return keep_for(selector.among)
    return selector


def check_keep_holds(checkpointer: Any, average: Average, what: str) -> None:
    """Refuse a checkpointer whose keep cannot hold what `average` picks."""
    if keep_holds(checkpointer.keep, average.selector) is False:
        raise ConfigError(
            f"{what}={average!r} averages checkpoints this run's checkpointer does not "
            f"keep (keep={checkpointer.keep!r}). Keep them while training, e.g. "
            f"Checkpointer(keep=(Best(3), {keep_for(average.selector)!r}))."
        )


def short_average_message(average: Average, picks: int, what: str) -> str | None:
    """The warning when a run holds fewer checkpoints than `average` asks for."""
    wanted = expected_count(average.selector)
    if wanted is None or picks >= wanted:
        return None
    return (
        f"{what}={average!r} wants {wanted} checkpoints but the run holds {picks} "
        f"(it ended early); keeping the final weights."
    )


def _leaf_text(array: np.ndarray) -> str:
    return f"{array.dtype}{list(array.shape)}"


def _mismatches(
    reference: dict[str, np.ndarray], other: dict[str, np.ndarray]
) -> list[str]:
    problems = []
    for key in sorted(set(reference) | set(other)):
        if key not in other:
            problems.append(f"{key} is only in the first")
        elif key not in reference:
            problems.append(f"{key} is only in the second")
        elif (
            reference[key].shape != other[key].shape
            or reference[key].dtype != other[key].dtype
        ):
            problems.append(
                f"{key} is {_leaf_text(reference[key])} in the first but "
                f"{_leaf_text(other[key])} in the second"
            )
    return problems


def _accumulator(dtype: Any) -> Any:
    """The wide dtype a leaf of `dtype` is summed in before it is cast back."""
    return np.complex128 if jnp.issubdtype(dtype, jnp.complexfloating) else np.float64


def average_records(
    entries: Sequence[ManifestEntry],
    directory: str,
    average: Average,
    state_entry: ManifestEntry,
    *,
    run_label: str,
) -> CheckpointRecord:
    """Load `entries`' records from `directory` and average them into one record.

    The result is an in-memory `CheckpointRecord` (path: the state pick's file)
    whose header carries `averaged_from`: the spec, run, directory, files, epochs
    and weights.
    """
    if not entries:
        raise CheckpointError(f"{average!r} picked no checkpoint to average.")
    weight = 1.0 / len(entries)
    sums: dict[str, np.ndarray] = {}
    reference: dict[str, np.ndarray] = {}
    first_path = ""
    kept: dict[str, np.ndarray] = {}
    state_header: RecordHeader | None = None
    for index, entry in enumerate(entries):
        path = os.path.join(directory, entry.file)
        record = CheckpointRecord(path)
        averaged = {k: v for k, v in record.arrays.items() if k.startswith(_AVERAGED)}
        if index == 0:
            reference, first_path = averaged, path
        else:
            problems = _mismatches(reference, averaged)
            if problems:
                raise CheckpointError(
                    f"Cannot average {first_path} (first) and {path} (second): their "
                    f"parameter trees differ: {'; '.join(problems[:3])}. Every "
                    f"checkpoint an Average picks must come from the same model."
                )
        for key, value in averaged.items():
            # JAX's dtype lattice, not NumPy's: it knows bfloat16 is a float.
            if jnp.issubdtype(value.dtype, jnp.inexact):
                total = sums.get(key)
                scaled = value.astype(_accumulator(value.dtype)) * weight
                sums[key] = scaled if total is None else total + scaled
            elif not np.array_equal(value, reference[key]):
                raise CheckpointError(
                    f"Cannot average {key}: it is a {value.dtype} leaf (not a float) "
                    f"and differs between {first_path} and {path}."
                )
        if entry == state_entry:
            kept = {
                k: v
                for k, v in record.arrays.items()
                if k.startswith(("state/", "device/", "host/"))
            }
            state_header = record.header
    assert state_header is not None, "the state pick is one of the entries"
    arrays = dict(kept)
    for key, value in reference.items():
        arrays[key] = sums[key].astype(value.dtype) if key in sums else value
    header = dataclasses.replace(
        state_header,
        averaged_from={
            "spec": repr(average),
            "run": run_label,
            "dir": directory,
            "files": [e.file for e in entries],
            "epochs": [e.epoch for e in entries],
            "weights": [weight] * len(entries),
            "state_from": state_entry.file,
        },
        run=None,
        metrics={},
        stop_reason=None,
        # An average continues no logged run: nothing for a logger to reattach to.
        logger_state=None,
    )
    return CheckpointRecord.in_memory(
        arrays, header, os.path.join(directory, state_entry.file)
    )
