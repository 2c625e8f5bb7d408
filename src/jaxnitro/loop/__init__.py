"""The loop: one training epoch in calls of 1 to K steps (`EpochContext`), and
validate/evaluate/predict passes (`EvalHost`). Below the run: it imports nothing
from `run/`; the handle drives it."""

from .context import EpochContext as EpochContext
from .context import EvalHost as EvalHost

__all__ = [
    "EpochContext",
    "EvalHost",
]
