"""Compiled programs and the module-level compile cache."""

from .cache import cache_reset as cache_reset
from .cache import cache_stats as cache_stats

__all__ = [
    "cache_reset",
    "cache_stats",
]
