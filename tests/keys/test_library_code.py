"""Which code is the user's: a library is told by its distribution, not by the folder
it imports from (a copy of JAX first on PYTHONPATH is still JAX), and no library
function is ever walked by the code fingerprint."""

import importlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import flax.nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from process_jobs import child_env, child_path

import jaxnitro as nx
from jaxnitro.keys import fingerprint as fingerprint_module
from jaxnitro.keys.fingerprint import fingerprint
from jaxnitro.keys.library_code import (
    forget_installed,
    is_library_module,
    is_user_code,
)

LIBRARIES = ("jax", "jaxlib", "optax", "flax", "numpy", "jaxnitro")


@pytest.fixture(autouse=True)
def _fresh_table():
    """Each test reads the installed distributions from its own working directory."""
    forget_installed()
    yield
    forget_installed()


# --- is_user_code ------------------------------------------------------------------


@pytest.mark.parametrize(
    "obj",
    [jax.nn.relu, jnp.sum, optax.adam, flax.nnx.Linear, np.sum, json.dumps, nx.Nitro],
    ids=["jax", "jax.numpy", "optax", "flax", "numpy", "json", "jaxnitro"],
)
def test_installed_libraries_the_stdlib_and_jaxnitro_are_not_user_code(obj):
    assert not is_user_code(obj)


def test_a_module_on_sys_path_that_no_distribution_installed_is_user_code(
    tmp_path, monkeypatch
):
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    (folder / "own_helpers.py").write_text("def helper(x):\n    return x + 1\n")
    monkeypatch.syspath_prepend(str(folder))
    module = importlib.import_module("own_helpers")
    try:
        assert is_user_code(module.helper)
    finally:
        sys.modules.pop("own_helpers", None)


def test_a_module_made_in_memory_is_user_code():
    namespace: dict = {"__name__": "made_in_memory"}
    exec("def cell(x):\n    return x\n", namespace)
    assert is_user_code(namespace["cell"])  # not in sys.modules: a notebook's cell


def test_a_copy_of_a_library_is_a_library_and_a_namesake_in_the_tree_is_not(tmp_path):
    """`pip install --target ./deps` puts jax's own files in the working tree: still
    jax. A user's `optax/helpers.py` or `code.py` only shares a library's name."""
    assert is_library_module("optax._src.alias", str(tmp_path / "optax/_src/alias.py"))
    assert is_library_module("optax", str(tmp_path / "deps/optax/__init__.py"))
    assert not is_library_module("optax.helpers", str(tmp_path / "optax/helpers.py"))
    assert not is_library_module("code", str(tmp_path / "code.py"))
    assert is_library_module("json", json.__file__)
    assert is_library_module("sys", None)  # built in
    assert not is_library_module("cell", None)  # made in memory
    assert not is_library_module("__main__", None)  # a notebook


def _fake_distribution(site, name, *, source, top_level=True):
    """An editable install of `name` from `source`, as pip writes it (PEP 610)."""
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"
    )
    url = {"url": Path(source).as_uri(), "dir_info": {"editable": True}}
    (info / "direct_url.json").write_text(json.dumps(url))
    pth = f"__editable__.{name}-1.0.pth"
    (site / pth).write_text(str(source / "src") + "\n")
    (info / "RECORD").write_text(f"{pth},,\n{info.name}/RECORD,,\n")
    if top_level:
        (info / "top_level.txt").write_text(f"{name}\n")


def test_without_top_level_txt_the_top_levels_are_read_from_the_record(tmp_path):
    # What a wheel without top_level.txt installed: packages, a module, an
    # extension, a quoted path holding a comma; not its metadata, data or scripts.
    import importlib.machinery
    from importlib.metadata import PathDistribution

    from jaxnitro.keys.library_code import _top_levels

    info = tmp_path / "wheelish-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: wheelish\nVersion: 1.0\n"
    )
    rows = [
        "wheelish/__init__.py,sha256=x,10",
        "wheelish/sub/deep.py,,",
        '"commas,pkg/mod.py",,',
        "single_module.py,,",
        f"fast{importlib.machinery.EXTENSION_SUFFIXES[0]},,",
        "wheelish-1.0.dist-info/RECORD,,",
        "wheelish-1.0.data/scripts/tool,,",
        "../../bin/wheelish-cli,,",
        "wheelish/py.typed,,",
        "__pycache__/single_module.cpython-311.pyc,,",
    ]
    (info / "RECORD").write_text("\n".join(rows) + "\n")
    provided = _top_levels(PathDistribution(info), editable=False)
    assert provided == {"wheelish", "single_module", "fast"}


@pytest.mark.parametrize("top_level", [True, False], ids=["top_level.txt", "pth only"])
def test_an_editable_install_of_the_working_tree_is_user_code(
    tmp_path, monkeypatch, top_level
):
    project = tmp_path / "project"
    (project / "src" / "myproject").mkdir(parents=True)
    (project / "src" / "myproject" / "__init__.py").write_text("")
    _fake_distribution(
        tmp_path / "site", "myproject", source=project, top_level=top_level
    )
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    module = str(project / "src/myproject/model.py")
    monkeypatch.chdir(project)  # the project's root
    assert not is_library_module("myproject.model", module)
    forget_installed()
    (project / "notebooks").mkdir()
    monkeypatch.chdir(project / "notebooks")  # a folder inside it
    assert not is_library_module("myproject.model", module)


@pytest.mark.parametrize("top_level", [True, False], ids=["top_level.txt", "pth only"])
def test_an_editable_install_from_elsewhere_is_a_library(
    tmp_path, monkeypatch, top_level
):
    library = tmp_path / "checkouts" / "somelib"
    (library / "src" / "somelib").mkdir(parents=True)
    (library / "src" / "somelib" / "__init__.py").write_text("")
    _fake_distribution(
        tmp_path / "site", "somelib", source=library, top_level=top_level
    )
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    assert is_library_module("somelib.layers", str(library / "src/somelib/layers.py"))
    work_namesake = str(tmp_path / "work/somelib/layers.py")
    assert not is_library_module("somelib.layers", work_namesake)


def test_at_the_filesystem_root_no_editable_install_is_the_users(tmp_path, monkeypatch):
    """A container's working directory `/` holds every folder: it names no project."""
    library = tmp_path / "somelib"
    (library / "src" / "somelib").mkdir(parents=True)
    _fake_distribution(tmp_path / "site", "somelib", source=library)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.chdir("/")
    assert is_library_module("somelib.layers", str(library / "src/somelib/layers.py"))


READ_AHEAD_CHILD = """
import importlib.metadata, json, threading
import optax
import jaxnitro
from jaxnitro.keys.library_code import is_library_module

for thread in threading.enumerate():
    if thread.name == "jaxnitro-installed":
        thread.join()
reads = []
importlib.metadata.distributions = lambda *a, **k: reads.append(1) or []
print(json.dumps({"optax": is_library_module("optax", optax.__file__), "reads": reads}))
"""


def test_the_distributions_are_read_on_a_thread_the_import_starts(tmp_path):
    """`import jaxnitro` reads the installed distributions on a thread (0.13 s of a
    TPU host's first step when read on the way to it): the first lookup, here after
    that thread, reads none again, and knows optax for a library."""
    report = json.loads(_last_line_of(READ_AHEAD_CHILD, tmp_path))
    assert report == {"optax": True, "reads": []}


def _last_line_of(code: str, folder: Path) -> str:
    """Run `code` in a fresh interpreter in `folder`; its output's last line."""
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code],
        env=child_env(),
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


NO_THREAD_CHILD = """
import threading

def refuse(self):
    raise RuntimeError("can't start new thread")

threading.Thread.start = refuse  # a process at its thread limit
import optax
import jaxnitro
from jaxnitro.keys.library_code import is_library_module

print(is_library_module("optax", optax.__file__))
"""


def test_where_no_thread_can_start_the_import_works_and_the_lookup_reads(tmp_path):
    assert _last_line_of(NO_THREAD_CHILD, tmp_path) == "True"


FORK_CHILD = """
import os, sys
import jaxnitro.keys.library_code as library_code

library_code.forget_installed()
library_code._READING.acquire()  # as if the thread were reading at the fork
pid = os.fork()
if pid == 0:  # the child reads the table itself, or hangs on the inherited lock
    import signal
    signal.alarm(20)  # a hung child ends by itself
    import optax
    ok = library_code.is_library_module("optax", optax.__file__)
    os._exit(0 if ok else 3)
library_code._READING.release()
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
"""


def test_a_child_forked_during_the_read_reads_the_table_itself(tmp_path):
    """A process pool forked right after `import jaxnitro` may fork while the thread
    holds its lock: the child does not wait for a thread it does not have."""
    assert _last_line_of(FORK_CHILD, tmp_path) == "0"


# --- no library function is walked ---------------------------------------------------

WALKER = """
import flax.nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from experiments import Tiny, mlp

LABELS = np.array(["cat", "dog", "bird"], dtype=object)


def activation(x):
    return jax.nn.relu(x) + 0.0 * jnp.tanh(x) + 0.0 * flax.nnx.relu(x)


def clipped_adam(learning_rate):
    return optax.chain(optax.clip(1.0), optax.adam(learning_rate))


class Walker(Tiny):
    def forward(self, model, params, state, *, x):
        return activation(mlp(params, x)) * (len(LABELS) / 3), state

    def loss(self, logits, *, y):
        return optax.softmax_cross_entropy(logits, y).mean()

    def optimizer(self):
        return clipped_adam
"""


def spy_walked(fingerprinter_class, walked):
    """Record the module of every function the fingerprint walks as user code."""
    original = fingerprinter_class._user_function

    def recording(self, fn, owner):
        walked.add(fn.__module__)
        return original(self, fn, owner)

    return recording


def test_no_library_function_is_walked(tmp_path, monkeypatch):
    walked: set[str] = set()
    monkeypatch.setattr(
        fingerprint_module._Fingerprinter,
        "_user_function",
        spy_walked(fingerprint_module._Fingerprinter, walked),
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "walker_exp.py").write_text(WALKER)
    module = importlib.import_module("walker_exp")
    try:
        fingerprint(module.Walker.forward, module.Walker.loss, owner=module.Walker)
        nx.Nitro(module.Walker(max_epochs=1), logger=None, checkpointer=None).train()
    finally:
        sys.modules.pop("walker_exp", None)
    assert "walker_exp" in walked
    assert not [m for m in walked if m.partition(".")[0] in LIBRARIES], walked


CHILD = """
import json
import sys

import jax

import jaxnitro as nx
from jaxnitro.keys.fingerprint import _Fingerprinter

walked = set()
original = _Fingerprinter._user_function


def recording(self, fn, owner):
    walked.add(fn.__module__)
    return original(self, fn, owner)


_Fingerprinter._user_function = recording
{walker}
nx.Nitro(Walker(max_epochs=1), logger=None, checkpointer=None).train()
print(json.dumps({{"jax": jax.__file__, "walked": sorted(walked)}}))
"""


def test_jax_and_optax_imported_from_a_folder_on_pythonpath_are_libraries(tmp_path):
    """JAX on PYTHONPATH (as on a TPU machine, or `pip install --target`), not in a
    folder sysconfig names: training works and JAX is named, never walked."""
    deps = tmp_path / "deps"
    for name in ("jax", "optax"):
        installed = Path(importlib.import_module(name).__file__).parent
        shutil.copytree(installed, deps / name, ignore=shutil.ignore_patterns("*.pyc"))
    (tmp_path / "child.py").write_text(CHILD.format(walker=WALKER))
    env = child_env()
    env["PYTHONPATH"] = child_path(str(deps))  # the copies first
    done = subprocess.run(
        [sys.executable, str(tmp_path / "child.py")],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["jax"] == str(deps / "jax" / "__init__.py")
    assert "__main__" in report["walked"]
    walked = report["walked"]
    assert not [m for m in walked if m.partition(".")[0] in LIBRARIES], walked
