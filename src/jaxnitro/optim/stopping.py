"""`EarlyStopping`, and the `should_stop(epoch, metrics)` protocol custom policies use.

An epoch improves when the watched metric beats the best so far by more than
`min_delta` (absolute, as in Keras and Lightning); the run stops after `patience`
epochs in a row without improvement. An unscored epoch (`watch.is_unscored`: the
metric NaN or infinite, or the validation pass's forward outputs were) never
improves. The stopping epoch still validates and
checkpoints, then `train()` returns with stop_reason "early_stop". Setup copies the
instance with the monitor filled in and fresh counters, so two handles never share them
and the instance you passed is never mutated; the counters are stored in each
checkpoint and a resume continues from them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from ..watch import check_mode, check_pair, follow_monitor, read_watched


@dataclass
class EarlyStopping:
    """Stop training when a validation metric stops improving.

    Args:
        metric: what to watch: a metric name, given with `mode` or neither; neither
            follows the run's `monitor`.
        mode: "min" or "max", given with `metric` or neither.
        patience: epochs without improvement before stopping (>= 1).
        min_delta: how much better than the best an epoch must be to improve.

    Examples:
        >>> es = EarlyStopping(metric="loss", mode="min", patience=2)
        >>> [es.should_stop(e, {"loss": v}) for e, v in enumerate([3, 2, 2.5, 2.1], 1)]
        [False, False, False, True]
    """

    metric: str | None = None
    mode: str | None = None
    patience: int = 5
    min_delta: float = 1e-4
    best: float = field(default=math.nan, repr=False)
    wait: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        check_mode(self.mode, "EarlyStopping")
        check_pair(self.metric, self.mode, "EarlyStopping")
        if not isinstance(self.patience, int) or self.patience < 1:
            raise ConfigError(
                f"EarlyStopping(patience={self.patience!r}) must be an int >= 1."
            )
        if not float(self.min_delta) >= 0:
            raise ConfigError(
                f"EarlyStopping(min_delta={self.min_delta!r}) must be >= 0."
            )

    def bound(self, monitor: tuple[str, str] | None) -> EarlyStopping:
        """A fresh copy for one handle, following `monitor` where unset."""
        metric, mode = follow_monitor(
            self.metric,
            self.mode,
            monitor,
            owner="EarlyStopping",
            spelled="EarlyStopping(metric=..., mode=...)",
        )
        return EarlyStopping(metric, mode, self.patience, self.min_delta)

    def should_stop(self, epoch: int, metrics: dict[str, Any]) -> bool:
        """Update with one epoch's validation metrics; whether to stop now."""
        del epoch
        if self.metric is None or self.mode is None:
            raise ConfigError("EarlyStopping must be bound to a metric first.")
        value = read_watched(
            metrics,
            self.metric,
            "early-stopping metric",
            error=ConfigError,
            watcher=f"EarlyStopping watches `{self.metric}`",
            hint=" Pass a metric it returns.",
            non_finite_ok=True,
        )
        if not math.isfinite(value):  # warned of by evaluation: no improvement
            self.wait += 1
            return self.wait >= self.patience
        better = (
            math.isnan(self.best)
            or (self.mode == "min" and value < self.best - self.min_delta)
            or (self.mode == "max" and value > self.best + self.min_delta)
        )
        if better:
            self.best, self.wait = value, 0
            return False
        self.wait += 1
        return self.wait >= self.patience

    def state(self) -> dict[str, Any]:
        """The counters, as a checkpoint stores them."""
        return {
            "metric": self.metric,
            "mode": self.mode,
            "best": None if math.isnan(self.best) else self.best,
            "wait": self.wait,
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint's counters when it watched the same pair."""
        if (state.get("metric"), state.get("mode")) == (self.metric, self.mode):
            best = state.get("best")
            self.best = math.nan if best is None else float(best)
            self.wait = int(state.get("wait", 0))


def bind_stopper(policy: Any, monitor: tuple[str, str] | None) -> Any:
    """The handle's early-stopping policy.

    An `EarlyStopping` is copied with the monitor filled in and fresh counters. A
    custom policy (any object with `should_stop(epoch, metrics)`) is kept as given:
    the handle stores the object, so a method redefined later applies next epoch.
    """
    if policy is None:
        return None
    if isinstance(policy, EarlyStopping):
        return policy.bound(monitor)
    if not callable(getattr(policy, "should_stop", None)):
        raise ConfigError(
            f"early_stop must be an EarlyStopping or an object with a "
            f"should_stop(epoch, metrics) method; got {type(policy).__name__}."
        )
    return policy
