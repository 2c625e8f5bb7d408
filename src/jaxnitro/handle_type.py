"""`RunHandle`: what a live run handle is, for the layers below the handle.

The checkpoint sources accept a live handle (`weights=nitro`) and `logger_info` takes
one in place of a logger; neither may import `run.handle`, which imports them. They
test `isinstance(value, RunHandle)` instead, and `Nitro` registers itself here.
"""

from __future__ import annotations

import abc
from typing import Any


class RunHandle(abc.ABC):  # noqa: B024 - a marker: Nitro registers, nothing overrides
    """The abstract type of a live run handle (`jaxnitro.Nitro` is one).

    What the layers below read of it: `parameters`, `states`, `experiment`,
    `checkpointer`, `run_dir`, `checkpoint_run`, `logger`.
    """

    logger: Any
