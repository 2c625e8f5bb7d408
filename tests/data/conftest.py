"""The data tests' `clean` fixture: a test leaves no prefetch thread and no device
array behind.
"""

import gc

import pytest
from toy_sources import live_arrays, surviving_threads


@pytest.fixture(scope="module")
def _frozen_heap():
    """Everything alive before the module's first `clean` test, moved out of the
    collector's sight (gc.freeze): a full collection then walks only what the tests
    allocate since, not all of JAX, Flax and the loggers (a third of a second each)."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.fixture
def clean(_frozen_heap):
    """Assert a test leaves no prefetch thread and no device array behind."""
    gc.collect()  # arrays earlier tests dropped would otherwise vanish mid-test
    live = live_arrays()
    yield
    assert surviving_threads() == []
    gc.collect()
    assert live_arrays() == live
