"""The run's default logger and checkpointer, for an experiment that keeps the base's.

`Experiment.logger()` and `Experiment.checkpointer()` return `RUN_DEFAULT`: the
experiment layer names no logger or checkpointer class, since both live in layers
above it (logging/, checkpoint/). The run makes them here, once per construction,
where `RunConfig.resolve` reads the two accessors: a new `JSONLogger` (setup points
it at `<run_dir>/metrics.jsonl`) and a new `Checkpointer()` (the best 3 by the
monitor and the latest).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..checkpoint.checkpointer import Checkpointer
from ..experiment.run_accessors import RUN_DEFAULT
from ..logging.jsonl import JSONLogger

_DEFAULTS: dict[str, Callable[[], Any]] = {
    "logger": JSONLogger,
    "checkpointer": Checkpointer,
}


def run_default(name: str, value: Any) -> Any:
    """`value`, or a new default `name` ("logger" or "checkpointer") when `value`
    is `RUN_DEFAULT`.

    Examples:
        >>> run_default("checkpointer", RUN_DEFAULT)
        Checkpointer(keep=(Best(k=3, among=None), Last(n=1)), metric=None, mode=None)
        >>> run_default("logger", None) is None
        True
    """
    return _DEFAULTS[name]() if value is RUN_DEFAULT else value
