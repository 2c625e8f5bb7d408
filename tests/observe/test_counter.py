"""The progress counter: monotonic, and exact across threads."""

from __future__ import annotations

import threading

import pytest

from jaxnitro.errors import NitroError
from jaxnitro.observe.counter import advance_progress_counter, progress_counter


def test_the_progress_counter_is_monotonic_and_refuses_negative_units():
    before = progress_counter()
    advance_progress_counter()
    advance_progress_counter(3)
    advance_progress_counter(0)
    assert progress_counter() - before == 4
    with pytest.raises(
        NitroError,
        match=r"advance_progress_counter\(units=-1\): the progress counter is "
        r"monotonic, so units must be >= 0",
    ):
        advance_progress_counter(-1)
    assert progress_counter() - before == 4


def test_the_progress_counter_counts_across_threads():
    before = progress_counter()
    workers = [
        threading.Thread(
            target=lambda: [advance_progress_counter() for _ in range(500)]
        )
        for _ in range(4)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert progress_counter() - before == 2000
