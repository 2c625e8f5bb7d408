"""Run ids a log reader cannot mistake for numbers."""

import io
import json
import uuid

import pandas as pd

from jaxnitro.checkpoint import filenames


def test_a_run_id_that_would_read_as_a_number_is_drawn_again(monkeypatch):
    # All decimal digits, then an exponent form: pandas reads both as numbers.
    drawn = iter(["07198650" + "0" * 24, "12e45678" + "0" * 24, "0a1b2c3d" + "0" * 24])
    monkeypatch.setattr(uuid, "uuid4", lambda: uuid.UUID(next(drawn)))
    assert filenames.new_run_id() == "0a1b2c3d"


def test_a_runs_log_keeps_its_run_id_a_string_for_pandas():
    # Each run's log holds one run id: read alone, one that looked like a number
    # would come back as one (before, about 1 run in 40).
    for _ in range(400):
        run_id = filenames.new_run_id()
        line = json.dumps({"run_id": run_id, "step": 1}) + "\n"
        read = pd.read_json(io.StringIO(line * 2), lines=True)
        assert list(read["run_id"]) == [run_id, run_id]
