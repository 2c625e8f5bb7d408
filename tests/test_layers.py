"""The package's layering rule (docs/architecture.md), checked on the source.

The layers below the run (experiment, compile, optim, data, checkpoint, logging,
observe) never import `run/` (the handle, its setup and restore) or `loop/`: every
import is read from the source, those deferred into a function or written under
TYPE_CHECKING included, since each closes an import cycle all the same.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import jaxnitro

PACKAGE = Path(jaxnitro.__file__).parent
LOWER = (
    "experiment",
    "compile",
    "optim",
    "data",
    "checkpoint",
    "logging",
    "observe",
    "devices",
)
UPPER = ("run", "loop")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, module) for every import of the package in `path`, relative or not."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.split(".")
            base = base[: len(base) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
            found.append((node.lineno, target))
            if node.module is None:  # `from . import restore` imports a module too
                found += [(node.lineno, f"{target}.{a.name}") for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
    return [(line, m) for line, m in found if m.split(".")[0] == root.name]


def upward_imports(root: Path) -> list[str]:
    """Each import from a lower layer into run/ or loop/, as `file:line: a -> b`."""
    top = root.name
    broken = []
    for path in sorted(root.rglob("*.py")):
        name = module_name(path, root)
        layer = name.split(".")[1] if "." in name else ""
        if layer not in LOWER:
            continue
        for line, target in imported_modules(path, root):
            parts = target.split(".")
            if len(parts) > 1 and parts[0] == top and parts[1] in UPPER:
                where = path.relative_to(root.parent)
                broken.append(f"{where}:{line}: {name} -> {target}")
    return broken


def test_no_lower_layer_imports_the_run_or_the_loop():
    checked = [p for p in PACKAGE.rglob("*.py") if p.parent.name in LOWER]
    assert len(checked) > 40  # the walk sees the package, not an empty folder
    assert upward_imports(PACKAGE) == []


@pytest.mark.parametrize(
    "statement",
    [
        "from ..run.handle import Nitro",
        "from ..loop import train",
        "import jaxnitro.run.setup",
        "from jaxnitro.run import restore",
    ],
)
def test_an_upward_import_is_caught_deferred_or_not(tmp_path, statement):
    root = tmp_path / "jaxnitro"
    (root / "run").mkdir(parents=True)
    (root / "loop").mkdir()
    (root / "checkpoint").mkdir()
    for package in (root, root / "run", root / "loop", root / "checkpoint"):
        (package / "__init__.py").write_text("")
    (root / "run" / "handle.py").write_text("class Nitro: ...\n")
    (root / "checkpoint" / "sources.py").write_text(
        f"def is_nitro(value):\n    {statement}\n    return value\n"
    )
    [found] = upward_imports(root)
    assert found.startswith("jaxnitro/checkpoint/sources.py:2: ")
    assert "jaxnitro.checkpoint.sources -> jaxnitro." in found


def test_the_package_root_holds_few_modules():
    flat = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")
    assert len(flat) <= 10, flat


def test_only_package_inits_assemble_the_public_api():
    """The root and each subpackage's `__init__.py` assemble the public API; no other
    module re-exports another's names (`from .x import y as y`, or an `__all__`
    listing a name it does not define itself)."""
    hubs = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "__init__.py":
            continue
        tree = ast.parse(path.read_text())
        own = {
            n.name
            for n in tree.body
            if isinstance(n, ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef)
        } | {
            t.id
            for n in tree.body
            if isinstance(n, ast.Assign | ast.AnnAssign)
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
            if isinstance(t, ast.Name)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                hubs += [
                    f"{path.name}: {a.name}" for a in node.names if a.asname == a.name
                ]
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
            ):
                listed = ast.literal_eval(node.value)
                hubs += [f"{path.name}: __all__ {n}" for n in listed if n not in own]
    assert hubs == []


# The loop is a layer below the run: the training epoch takes an `EpochContext` and
# the state, an evaluation pass its owner as an `EvalHost` protocol; nothing under
# loop/ imports run/ (the handle imports the loop, never the reverse).
def test_the_loop_imports_nothing_from_the_run():
    found = []
    for path in sorted((PACKAGE / "loop").glob("*.py")):
        for line, target in imported_modules(path, PACKAGE):
            if target.split(".")[1:2] == ["run"]:
                found.append(f"loop/{path.name}:{line}: {target}")
    assert found == []
