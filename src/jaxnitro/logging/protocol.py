"""The logger protocol: duck-typed verbs, no base class, no registration.

A logger is any object with the verbs the run reaches. The framework calls the six
writing verbs directly, so one a logger lacks fails loudly, naming the verb, the first
time the run needs it; a contract of silent no-ops would make every wrapper lossy:

    log_metrics(metrics, *, step, epoch, context, **kwargs)
    log_params(params)
    log_other(key, value)
    log_tags(tags)
    log_confusion(matrix, labels, *, epoch)
    finish(status)            # "completed", "early_stop", "requested", "preempted",
                              # or "error"

Six informational verbs are optional, with the defaults of the helpers below:
`run_id()`, `run_url()`, `logger_info()`, `logger_state()`, `reattach(state)` (needed
exactly when `logger_state` returns something) and `backend()`.

Two more are optional, for a logger that keeps lines in memory before writing them
(`JSONLogger` does): `log_deferred_metrics(line, *, step, epoch, context)` takes a
train line whose values are still on the device (`deferred.DeferredMetrics`), to read
back later with the others it holds; without it the line is resolved and passed to
`log_metrics` at once. `flush()` writes what it holds (a run calls it once an epoch,
after the epoch line, and before each validation and on_epoch_end hook).
`log_resume(*, step, epoch, run_id, source)` is told where a resumed run continues
from; without it nothing is logged. `log_epoch(row)` takes the
history row of each epoch trained (the handle's `history` row: epoch, step,
train_loss, the validation metrics, seconds), so the whole run's history can be read
back from the log (`nitro history`); without it nothing is logged.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Protocol, runtime_checkable

from ..errors import HookError
from ..handle_type import RunHandle
from .deferred import DeferredMetrics


@runtime_checkable
class Logger(Protocol):
    """The verbs the training loop calls on every run (see the module docstring)."""

    def log_metrics(
        self, metrics: dict[str, Any], *, step: int, epoch: int, context: str
    ) -> None: ...

    def log_params(self, params: dict[str, Any]) -> None: ...

    def log_other(self, key: str, value: Any) -> None: ...

    def finish(self, status: str) -> None: ...


def _verb(logger: Any, name: str) -> Any:
    method = getattr(logger, name, None)
    if method is None or not callable(method):
        raise HookError(
            f"The logger {type(logger).__name__} has no `{name}` method, which the run "
            f"needs now. Implement `{name}` on it (see jaxnitro.logging.protocol), or "
            f"pass logger=None to log nothing."
        )
    return method


def require_verbs(logger: Any, *names: str) -> None:
    """Raise now for a verb `logger` lacks, as its first call would (None: a run
    that logs nothing needs none).

    Raises:
        HookError: `logger` has no callable method of one of `names`.
    """
    if logger is not None:
        for name in names:
            _verb(logger, name)


def finite_only(metrics: dict[str, Any]) -> dict[str, Any]:
    """Drop non-finite real values; pass other values (arrays, strings) through."""
    kept = {}
    for key, value in metrics.items():
        if isinstance(value, numbers.Real) and not math.isfinite(value):
            continue
        kept[key] = value
    return kept


def log_metrics(
    logger: Any, metrics: dict[str, Any], *, step: int, epoch: int, context: str
) -> None:
    """Log host metric values under `context`, dropping non-finite numbers."""
    if logger is None:
        return
    _verb(logger, "log_metrics")(
        finite_only(metrics), step=step, epoch=epoch, context=context
    )


def log_deferred(
    logger: Any, line: DeferredMetrics, *, step: int, epoch: int, context: str
) -> None:
    """Log a line whose values are still on the device: held by a logger that takes
    such lines (`log_deferred_metrics`), else resolved now and logged as host values.
    """
    if logger is None:
        return
    method = getattr(logger, "log_deferred_metrics", None)
    if callable(method):
        method(line, step=step, epoch=epoch, context=context)
    else:
        log_metrics(logger, line.resolve(), step=step, epoch=epoch, context=context)


def flush(logger: Any) -> None:
    """Have a logger that holds lines in memory (`flush`) write them now."""
    method = getattr(logger, "flush", None)
    if callable(method):
        method()


def log_resume(
    logger: Any, *, step: int, epoch: int, run_id: str | None, source: str | None
) -> None:
    """Tell a logger that takes it (`log_resume`) where a resumed run continues:
    the step and epoch of the record `source`, under the run `run_id`."""
    method = getattr(logger, "log_resume", None)
    if callable(method):
        method(step=step, epoch=epoch, run_id=run_id, source=source)


def log_epoch(logger: Any, row: dict[str, Any]) -> None:
    """Give a logger that takes it (`log_epoch`) an epoch's history row."""
    method = getattr(logger, "log_epoch", None)
    if callable(method):
        method(row)


def log_params(logger: Any, params: dict[str, Any]) -> None:
    """Log the run's flat hyperparameters."""
    if logger is not None:
        _verb(logger, "log_params")(params)


def log_other(logger: Any, key: str, value: Any) -> None:
    """Log one free-form value under `key`."""
    if logger is not None:
        _verb(logger, "log_other")(key, value)


def log_tags(logger: Any, tags: Any) -> None:
    """Log free-form tags for the run."""
    if logger is not None:
        _verb(logger, "log_tags")(tags)


def log_confusion(logger: Any, matrix: Any, labels: Any, *, epoch: int) -> None:
    """Log a confusion matrix; the framework never calls this itself."""
    if logger is not None:
        _verb(logger, "log_confusion")(matrix, labels, epoch=epoch)


def finish(logger: Any, status: str) -> None:
    """Close the run on the backend with its stop reason."""
    if logger is not None:
        _verb(logger, "finish")(status)


def _optional(logger: Any, name: str, default: Any) -> Any:
    method = getattr(logger, name, None)
    return method() if callable(method) else default


def run_id(logger: Any) -> Any:
    """The backend's run identifier, or None."""
    return _optional(logger, "run_id", None)


def run_url(logger: Any) -> Any:
    """The backend's URL for the run, or None."""
    return _optional(logger, "run_url", None)


def logger_info(logger: Any) -> dict[str, Any]:
    """Plain data identifying where the backend writes (default: empty).

    Given a `Nitro`, the run's logger: `logger_info(nitro)` is
    `logger_info(nitro.logger)`.
    """
    if isinstance(logger, RunHandle):
        logger = logger.logger
    if logger is None:
        return {}
    return dict(_optional(logger, "logger_info", {}) or {})


def logger_state(logger: Any) -> Any:
    """What a resumed run needs to continue the same logged run, or None."""
    return _optional(logger, "logger_state", None)


def reattach(logger: Any, state: Any) -> None:
    """Point the logger back at the logged run `state` identifies."""
    if logger is None or state is None:
        return
    _verb(logger, "reattach")(state)


def backend(logger: Any) -> Any:
    """The native backend object behind a wrapping logger (the logger by default)."""
    method = getattr(logger, "backend", None)
    return method() if callable(method) else logger
