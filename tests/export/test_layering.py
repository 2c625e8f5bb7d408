"""export/ sits above run/: no lower layer, and neither run/ nor loop/, imports it."""

import importlib.util
from pathlib import Path

import jaxnitro

PACKAGE = Path(jaxnitro.__file__).parent
BELOW = (
    "experiment",
    "compile",
    "optim",
    "data",
    "checkpoint",
    "logging",
    "observe",
    "run",
    "loop",
)


def _layers_module():
    path = Path(__file__).parents[1] / "test_layers.py"
    spec = importlib.util.spec_from_file_location("_test_layers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_nothing_below_export_imports_it():
    layers = _layers_module()
    broken = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = layers.module_name(path, PACKAGE)
        if name.split(".")[1:2] and name.split(".")[1] in BELOW:
            for line, target in layers.imported_modules(path, PACKAGE):
                if target.split(".")[1:2] == ["export"]:
                    broken.append(f"{path.relative_to(PACKAGE)}:{line}: {target}")
    assert broken == []
    assert any((PACKAGE / "export").glob("*.py"))
