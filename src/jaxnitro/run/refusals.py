"""What a handle's verbs refuse before any work starts.

`train()` takes no keywords, `validate()` needs a val split and `evaluate(split)` that
split, `predict` takes batches rather than a bare array, and `on_epoch_end` a
function. Each message names the verb, what it got and the fix.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import jax
import numpy as np

from ..errors import ConfigError, RoutingError
from ..experiment.routing import HookFields

TRAIN_KEYWORDS = (
    "train() takes no keywords (got {names}): every run setting belongs to the Nitro "
    "constructor and is fixed there. To train further, build a new handle that "
    'continues this run: Nitro(e, resume="auto", max_epochs=N).'
)
NO_VAL_SPLIT = "validate() needs a val split; the data holds: {splits}."
NO_SUCH_SPLIT = (
    "evaluate(split={split!r}): the data has no split {split!r}. The splits are: "
    "{splits}."
)
PREDICT_INPUT = (
    "predict takes a batch dict or an iterable of them, not a {kind}: forward is "
    "routed by field name and declares {declared}. Pass {{{shown}}}."
)
EPOCH_END_HOOK = (
    "on_epoch_end takes a function (nitro, epoch, observations) -> metrics or None; "
    "got {kind}."
)


def refuse_train_keywords(kwargs: Mapping[str, Any]) -> None:
    """Refuse any keyword of `train()`: the run's settings are the constructor's."""
    if kwargs:
        raise ConfigError(TRAIN_KEYWORDS.format(names=", ".join(sorted(kwargs))))


def refuse_missing_split(data: Mapping[str, Any], split: str) -> None:
    """Refuse to validate without a val split, or to evaluate a split not in
    `data`."""
    if split in data:
        return
    if split == "val":
        raise ConfigError(NO_VAL_SPLIT.format(splits=", ".join(data) or "no splits"))
    raise ConfigError(
        NO_SUCH_SPLIT.format(split=split, splits=", ".join(data) or "none")
    )


def is_one_batch(batch: Any) -> bool:
    """Whether `predict` got one batch (a mapping or a NamedTuple), not several."""
    return isinstance(batch, Mapping) or hasattr(batch, "_asdict")


def refuse_predict_input(batch: Any, forward: HookFields) -> None:
    """Refuse a `predict` input that is neither a batch nor an iterable of batches
    (a bare array, a number), naming the fields forward declares."""
    if isinstance(batch, np.ndarray | jax.Array) or not isinstance(batch, Iterable):
        names = forward.required + forward.optional
        raise RoutingError(
            PREDICT_INPUT.format(
                kind=type(batch).__name__,
                declared=", ".join(names) or "no fields",
                shown=", ".join(f"'{n}': ..." for n in names) or "...",
            )
        )


def refuse_epoch_end_hook(hook: Any) -> None:
    """Refuse an `on_epoch_end` hook that is not callable."""
    if not callable(hook):
        raise ConfigError(EPOCH_END_HOOK.format(kind=type(hook).__name__))
