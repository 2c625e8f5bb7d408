"""The observe tests' fixtures: each test leaves the module-level monitor registry as
it found it; `h` is a history to read.
"""

from __future__ import annotations

import pytest
from history_rows import make_rows

from jaxnitro.observe.history import MetricHistory
from jaxnitro.observe.monitors import module_registry, unregister_phase_monitor


@pytest.fixture(autouse=True)
def _clean_module_registry():
    before = set(module_registry().own())
    yield
    for handle in module_registry().own():
        if handle not in before:
            unregister_phase_monitor(handle)


@pytest.fixture
def h():
    """A 30-epoch history whose best epoch by macro_recall is 19."""
    return MetricHistory(make_rows(), selection_metric=("macro_recall", "max"))
