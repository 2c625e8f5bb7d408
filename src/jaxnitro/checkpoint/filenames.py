"""Run ids: the id each run writes its checkpoint records under."""

from __future__ import annotations

import uuid


def new_run_id() -> str:
    """A short random run id: 8 hexadecimal digits, never all decimal digits or a
    number in exponent form ("07198650", "12e45678"), which a reader of the run's
    JSON lines log (`pandas.read_json`) would take for a number and change.

    >>> run_id = new_run_id()
    >>> len(run_id), _reads_as_number(run_id)
    (8, False)
    """
    while True:
        run_id = uuid.uuid4().hex[:8]
        if not _reads_as_number(run_id):
            return run_id


def _reads_as_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
