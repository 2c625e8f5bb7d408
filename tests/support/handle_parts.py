"""The parts behind a `Nitro` facade (`jaxnitro.run.parts.RunParts`), for the tests
that drive the training loop directly or read what only the run's own modules see
(the stop control, the eval width, the run directory's lock): the one place the
tests reach behind the handle's public face.
"""

from __future__ import annotations

from typing import Any

from jaxnitro.run.parts import RunParts


def parts_of(nitro: Any) -> RunParts:
    """The parts of a built handle."""
    parts = nitro._parts
    assert isinstance(parts, RunParts)
    return parts
