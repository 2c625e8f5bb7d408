"""The package's layering rules (docs/architecture.md), checked on the source.

Every package and root module has a place in one ordered list of layers, `LAYERS`,
lowest first. A module imports its own package, or a package of a lower layer; never
one of a higher layer, nor another package of its own layer. Every import is read
from the source: module-level ones, those deferred into a function and those written
under TYPE_CHECKING alike, since each closes an import cycle all the same. Older,
narrower checks stay beside it: the layers below the run never import `run/` or
`loop/`, and `loop/` never imports `run/`.
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

# The layers, lowest first. Each entry is a package under jaxnitro/ or a module at its
# root ("jaxnitro" is the root package's own __init__: the public API, assembled from
# the layers below it). Packages of one layer import nothing of each other.
LAYERS: tuple[tuple[str, ...], ...] = (
    # The foundations: they import nothing of jaxnitro.
    ("_version", "errors", "json_bounds", "handle_type"),
    # Lazy optional imports, the watched metric, metric modes, and the keys of
    # compiled programs (the code fingerprint, the cache key): errors alone below.
    ("extras", "watch", "metrics", "keys"),
    # The user's class, its fields and hooks.
    ("experiment",),
    # Sources, streams and batches (routing reads the experiment's hooks).
    ("data",),
    # Where a run executes: processes, meshes, placement, gathering batches.
    ("devices",),
    ("logging",),
    # Phases, progress, history: the compile layer announces its phases here.
    ("observe",),
    # The compiled programs; they take the optimizer as an `OptimizerStep`.
    ("compile",),
    ("optim", "checkpoint"),
    # The verbs' loops: epochs, calls, evaluation, taking a context and a state.
    ("loop",),
    # One run: the handle, its setup and restore.
    ("run",),
    # The model as a servable bundle: it reads a handle's public face, untyped.
    ("export",),
    ("jaxnitro",),
    # Front ends: the agent's tools, the run-file language.
    ("agent", "runfile"),
    ("commands",),
    ("cli",),
)
RANK = {unit: rank for rank, layer in enumerate(LAYERS) for unit in layer}


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


def unit_of(module: str) -> str:
    """The layer unit of a dotted module name: its package under the root, the
    root module itself, or the root package ("jaxnitro")."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def units(root: Path) -> set[str]:
    """Every unit the package holds: its subpackages and its root modules."""
    found = {root.name}
    for path in root.glob("*.py"):
        if path.stem != "__init__":
            found.add(path.stem)
    return found | {p.parent.name for p in root.glob("*/__init__.py")}


def layer_breaks(root: Path, layers: tuple[tuple[str, ...], ...]) -> list[str]:
    """Each import that breaks the order of `layers`, as `file:line: why`."""
    rank = {unit: r for r, layer in enumerate(layers) for unit in layer}
    broken = [f"{unit}: has no layer" for unit in sorted(units(root) - set(rank))]
    for path in sorted(root.rglob("*.py")):
        name = module_name(path, root)
        own = unit_of(name)
        if own not in rank:
            continue
        for line, target in imported_modules(path, root):
            other = unit_of(target)
            if other == own or (other in rank and rank[other] < rank[own]):
                continue
            if other not in rank:
                why = "a unit with no layer"
            elif rank[other] == rank[own]:
                why = f"a package of its own layer {rank[own] + 1}"
            else:
                why = f"layer {rank[other] + 1}, above its own {rank[own] + 1}"
            where = path.relative_to(root.parent)
            broken.append(f"{where}:{line}: {name} -> {target} ({why})")
    return broken


def test_every_import_follows_the_order_of_the_layers():
    assert layer_breaks(PACKAGE, LAYERS) == []


def test_every_layer_entry_names_a_unit_of_the_package():
    assert sorted(set(RANK) - units(PACKAGE)) == []
    assert len(RANK) == sum(len(layer) for layer in LAYERS)  # no unit named twice


def make_package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "jaxnitro"
    root.mkdir()
    (root / "__init__.py").write_text("")
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.parent != root:
            (path.parent / "__init__.py").touch()
        path.write_text(text)
    return root


TOY_LAYERS = (("errors",), ("experiment",), ("compile", "logging"), ("jaxnitro",))


@pytest.mark.parametrize(
    ("source", "why"),
    [
        ("from ..compile.cache import key\n", "layer 3, above its own 2"),
        (
            "def f():\n    from jaxnitro.compile import cache\n",
            "layer 3, above its own 2",
        ),
        (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from ..logging.jsonl import JSONLogger\n",
            "layer 3, above its own 2",
        ),
        ("import jaxnitro\n", "layer 4, above its own 2"),
        ("from ..unplaced import thing\n", "a unit with no layer"),
    ],
)
def test_an_import_against_the_order_is_caught_wherever_it_stands(
    tmp_path, source, why
):
    root = make_package(
        tmp_path,
        {
            "errors.py": "",
            "experiment/base.py": source,
            "compile/cache.py": "",
            "logging/jsonl.py": "",
            "unplaced/__init__.py": "",
        },
    )
    found = layer_breaks(root, TOY_LAYERS)
    assert found[0] == "unplaced: has no layer"
    [broken] = found[1:]
    assert broken.startswith("jaxnitro/experiment/base.py:")
    assert broken.endswith(f"({why})")


def test_packages_of_one_layer_import_nothing_of_each_other(tmp_path):
    root = make_package(
        tmp_path,
        {
            "errors.py": "",
            "experiment/base.py": "from ..errors import E\n",
            "compile/cache.py": "from ..experiment import base\nfrom . import x\n",
            "compile/x.py": "",
            "logging/jsonl.py": "def f():\n    from ..compile.cache import key\n",
        },
    )
    assert layer_breaks(root, TOY_LAYERS) == [
        "jaxnitro/logging/jsonl.py:2: jaxnitro.logging.jsonl -> jaxnitro.compile.cache"
        " (a package of its own layer 3)"
    ]


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
