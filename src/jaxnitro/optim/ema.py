"""`EMA`: an exponential moving average of the weights, updated in the training step.

    ema <- d * ema + (1 - d) * params,   d = min(beta, (1 + t) / (10 + t)) with warmup

at optimizer step t (0 for the first update), after every `every`-th optimizer step.
The average starts as a copy of the weights training starts from, lives on the device
beside them, is checkpointed and restored by a resume. Under `eval_weights="ema"` (the
default with an EMA) validation, checkpoint selection and predict read it; training
and `nitro.parameters` use the raw weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import ConfigError


@dataclass(frozen=True)
class EMA:
    """An exponential moving average of the weights.

    Args:
        beta: the decay, in (0, 1); typical values 0.99 to 0.9999.
        warmup: use min(beta, (1 + t) / (10 + t)) so the average is not dragged by
            the initial weights for the first 1 / (1 - beta) steps.
        every: update after every `every`-th optimizer step.

    Examples:
        >>> EMA(0.999).decay(0), EMA(0.999, warmup=False).decay(0)
        (0.1, 0.999)
    """

    beta: float
    warmup: bool = True
    every: int = 1

    def __post_init__(self) -> None:
        if not 0 < float(self.beta) < 1:
            raise ConfigError(f"EMA(beta) must be in (0, 1), got {self.beta!r}.")
        if not isinstance(self.every, int) or self.every < 1:
            raise ConfigError(f"EMA(every) must be an int >= 1, got {self.every!r}.")

    def decay(self, step: int) -> float:
        """The decay d used by the update after optimizer step `step` (0-based)."""
        if self.warmup:
            return min(float(self.beta), (1 + step) / (10 + step))
        return float(self.beta)

    def step_inputs(self, step: int) -> dict[str, Any]:
        """What the program receives for the update after optimizer step `step`."""
        update = (step + 1) % self.every == 0
        return {
            "decay": np.float32(self.decay(step)),
            "update": np.bool_(update),
        }


def ema_update(average: Any, params: Any, inputs: dict[str, Any]) -> Any:
    """One traced EMA update; a step that is not an update leaves it bit for bit."""
    d = inputs["decay"]

    def one(a: Any, p: Any) -> Any:
        new = (d * a + (1 - d) * p).astype(a.dtype)
        return jnp.where(inputs["update"], new, a)

    return jax.tree.map(one, average, params)
