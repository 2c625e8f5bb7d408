"""The loops: automatic training, and validate/evaluate/predict."""

from .rendering import render as render

__all__ = [
    "render",
]
