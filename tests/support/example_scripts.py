"""Load a script under examples/ as a module (examples/ is not a package)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@contextmanager
def example_module(filename: str, name: str) -> Iterator[ModuleType]:
    """`examples/<filename>` imported as module `name`, registered in sys.modules
    while in use (dataclasses and field docs look the module up)."""
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / filename)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(name, None)
