"""agent/ sits on top: nothing else in the package imports it but the CLI (the `mcp`
command in cli.py; `nitro train` and `nitro summary` in commands.py, which load an
experiment as the agent tools do), and only agent/server.py imports the `mcp` SDK,
inside a function."""

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

import jaxnitro

PACKAGE = Path(jaxnitro.__file__).parent


def _layers_module():
    path = Path(__file__).parents[1] / "test_layers.py"
    spec = importlib.util.spec_from_file_location("_test_layers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_only_the_cli_imports_the_agent_package():
    layers = _layers_module()
    importers = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        name = layers.module_name(path, PACKAGE)
        if name.split(".")[1:2] == ["agent"]:
            continue
        for _, target in layers.imported_modules(path, PACKAGE):
            if target.split(".")[1:2] == ["agent"]:
                importers.add(name)
    assert importers == {"jaxnitro.cli", "jaxnitro.commands"}


def test_the_sdk_is_imported_lazily_by_the_server_module_alone():
    importers = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            if any(n == "mcp" or n.startswith("mcp.") for n in names):
                importers.append((path.relative_to(PACKAGE).as_posix(), node))
    assert {where for where, _ in importers} == {"agent/server.py"}
    server = ast.parse((PACKAGE / "agent" / "server.py").read_text())
    top_level = {id(n) for n in server.body}
    assert all(id(node) not in top_level for _, node in importers)


@pytest.mark.slow  # a Python process of its own
def test_import_jaxnitro_does_not_load_the_sdk():
    code = "import sys, jaxnitro, jaxnitro.cli; print('mcp' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "False"
