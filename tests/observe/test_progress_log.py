"""The log reporter: progress as log records, steps and notes throttled."""

from __future__ import annotations

import io
import logging

from jaxnitro.observe.progress_log import LogReporter


def test_the_log_reporter_writes_records_and_throttles_steps_and_notes():
    now = [0.0]
    stream = io.StringIO()
    logger = logging.getLogger("tests.progress.log")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    handler = logging.StreamHandler(stream)
    records: list = []
    handler.addFilter(lambda r: records.append(r) or True)
    logger.addHandler(handler)
    try:
        log = LogReporter(logger, interval_s=5.0, clock=lambda: now[0])
        log("step", "", 0, 0, 0)  # before any begin: ignored
        log("begin", "train", 4, 1, 2)
        log("phase", "compiling gradient", 0, 0, 0)
        log("phase", "", 0, 0, 0)
        log("step", "", 0, 0, 0)  # within the interval: not written
        now[0] = 6.0
        log("step", "", 0, 0, 0)
        log("note", "fast", 0, 0, 0)  # within the interval again
        log("end", "", 0, 0, 0)
        log("done", "", 0, 0, 0)
    finally:
        logger.removeHandler(handler)
    assert stream.getvalue().splitlines() == [
        "  0% epoch 1/2: train",
        "  0% epoch 1/2: train [compiling gradient]",
        "  0% epoch 1/2: train",
        " 25% epoch 1/2: train",
        " 25% done: 1/2 epochs",
    ]
    first, *_, last = (r.progress for r in records)
    assert first["id"] == last["id"] and last["done"] and not first["done"]
    assert last == {**last, "name": "done: 1/2 epochs", "fraction": 0.25}
