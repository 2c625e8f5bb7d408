"""Run ids: the id each run writes its checkpoint records under."""

from __future__ import annotations

import uuid


def new_run_id() -> str:
    """A short random run id."""
    return uuid.uuid4().hex[:8]
