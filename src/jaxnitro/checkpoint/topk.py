"""`TopKCheckpointer`: the deprecated spelling of `Checkpointer(keep=...)`."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable

from .checkpointer import Checkpointer
from .selectors import Best, Last, Selector

_TOPK_WARNED = False


def TopKCheckpointer(  # noqa: N802 (the spec's name for a deprecated constructor)
    k: int = 3,
    metric: str | None = None,
    mode: str | None = None,
    dir: str | os.PathLike[str] | None = None,
    name: Callable[..., str] | None = None,
    keep_latest: bool = True,
    scope: str = "run",
) -> Checkpointer:
    """Deprecated: `Checkpointer(keep=(Best(k), Last(1)))`, or `keep=Best(k)` for
    `keep_latest=False`. Builds exactly that Checkpointer; warns once per process."""
    global _TOPK_WARNED
    keep: tuple[Selector, ...] = (Best(k), Last(1)) if keep_latest else (Best(k),)
    if not _TOPK_WARNED:
        _TOPK_WARNED = True
        spelled = f"(Best({k}), Last(1))" if keep_latest else f"Best({k})"
        warnings.warn(
            f"TopKCheckpointer is deprecated; write Checkpointer(keep={spelled}), "
            f"which it builds. It stays supported until at least 1.0.0.",
            DeprecationWarning,
            stacklevel=2,
        )
    return Checkpointer(
        keep=keep, metric=metric, mode=mode, dir=dir, name=name, scope=scope
    )
