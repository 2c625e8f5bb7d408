"""The default name of a checkpoint record: the `checkpoint_filename` hook's default.

`Experiment.checkpoint_filename` returns it, and a `Checkpointer` with neither a
`name` function nor an experiment's hook names its records with it; the public
spelling is `jaxnitro.checkpoint_filename`. It lives with the hook, below the
checkpoint layer that writes the records.
"""

from __future__ import annotations

import re

RECORD_SUFFIX = ".safetensors"


def sanitize_metric_name(name: str) -> str:
    """A metric name safe inside a filename."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def checkpoint_filename(
    *, epoch: int, step: int, metric: str | None = None, score: float | None = None
) -> str:
    """`epoch-0006-step-4500-loss=0.0416831.safetensors`; no score segment without one.

    The epoch comes first, zero-padded, so lexicographic order is training order.

    Examples:
        >>> checkpoint_filename(epoch=6, step=4500, metric="loss", score=0.04168312)
        'epoch-0006-step-4500-loss=0.0416831.safetensors'
        >>> checkpoint_filename(epoch=6, step=4500)
        'epoch-0006-step-4500.safetensors'
    """
    stem = f"epoch-{epoch:04d}-step-{step}"
    if score is not None and metric is not None:
        stem += f"-{sanitize_metric_name(metric)}={score:.6g}"
    return stem + RECORD_SUFFIX
