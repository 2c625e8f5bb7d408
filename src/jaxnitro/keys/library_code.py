"""Which code is the user's (walked by the code fingerprint) and which a library's
(named by module and qualname, never walked).

A module is told by what it is, not by the folder it was imported from, so a library
counts as one however it was installed (site-packages, `pip install --user` or
`--target`, a folder on PYTHONPATH, conda, a zipapp, an editable install):

1. jaxnitro itself, the builtins and the standard library (a module of
   `sys.stdlib_module_names` whose file lies in sysconfig's stdlib folder) are
   libraries.
2. A module whose top-level package an installed distribution provides (its
   `top_level.txt`, else the modules its RECORD lists; for an editable install also
   the packages in the folders its `.pth` adds) is a library, wherever it imports
   from. A file in the working tree must also be one that distribution installed
   (in its RECORD, or under an editable install's source folder): a user's `tests`
   package or `utils.py` only shares its name with a library's.
3. The exception: an editable install (PEP 610 `direct_url.json` with
   `dir_info.editable`) whose source folder is the working directory, below it or
   above it is the user's own project, installed so it imports; its modules are
   the user's. An editable install from elsewhere is a library being developed
   beside the project: named, like any library (a change to it is seen by a new
   process, not by a running one).
4. Anything else with a file in a site-packages folder (a module no distribution
   lists) is a library; the rest is the user's: a script (`__main__`), a notebook,
   a module made in memory, a package on `sys.path` that no distribution installed.

The distributions are read once per process, on a thread `import jaxnitro` starts
(`read_installed_in_background`: a few hundred small file reads, 0.13 s of a TPU
v5e host's first step when read on the way to it), else on the first lookup, which
waits for that thread; the working directory is the one at the first lookup. Each
module's answer is kept.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import functools
import importlib.machinery
import importlib.metadata
import inspect
import json
import os
import site
import sys
import sysconfig
import threading
import types
import urllib.parse
import urllib.request
from typing import Any

_OWN_PACKAGE = __name__.partition(".")[0]


def is_user_code(obj: Any) -> bool:
    """Whether `obj` is defined in the user's code rather than an installed library.

    Examples:
        >>> import json
        >>> is_user_code(json.dumps), is_user_code(is_user_code)
        (False, False)
    """
    module = sys.modules.get(getattr(obj, "__module__", None) or "")
    return module is None or is_user_module(module)


def is_user_module(module: types.ModuleType) -> bool:
    """Whether `module` is the user's (see the module docstring for the rule)."""
    path = getattr(module, "__file__", None)
    return not is_library_module(
        module.__name__, path if isinstance(path, str) else None
    )


@functools.lru_cache(maxsize=4096)
def is_library_module(name: str, path: str | None) -> bool:
    """Whether the module `name`, imported from the file `path` (None for one made
    in memory or built in), is a library's."""
    top = name.partition(".")[0]
    if top == _OWN_PACKAGE:
        return True
    if path is None:  # built in, frozen, or made in memory (a notebook's cells)
        return top in sys.builtin_module_names or top in sys.stdlib_module_names
    installed = _installed()
    real = os.path.realpath(path)
    if top in sys.stdlib_module_names and _is_under_any(real, installed.stdlib_roots):
        return True
    dists = installed.tops.get(top, ())
    in_tree = _is_under_any(real, installed.user_roots) or (
        installed.cwd is not None and _is_under(real, installed.cwd)
    )
    if dists and (not in_tree or any(_installed_by(d, name, real) for d in dists)):
        return True
    return _is_under_any(real, installed.site_roots)  # a module no distribution lists


@dataclasses.dataclass(frozen=True)
class _Provides:
    """One installed distribution: its editable source folder (None if it is no
    editable install) and the top-level modules it provides."""

    dist: importlib.metadata.Distribution
    source: str | None
    tops: frozenset[str]


@dataclasses.dataclass(frozen=True)
class _Installed:
    """What is installed, read once from `importlib.metadata` and `sysconfig`.

    Attributes:
        cwd: the working directory when it was read; None at the filesystem's root
            (a container's default), where no folder is the user's tree.
        tops: the library distributions providing each top-level module name.
        user_roots: the source folders of editable installs of the user's project.
        stdlib_roots: the standard library's folders.
        site_roots: the site-packages folders (sysconfig's, site's, the user's).
    """

    cwd: str | None
    tops: dict[str, tuple[_Provides, ...]]
    user_roots: tuple[str, ...]
    stdlib_roots: tuple[str, ...]
    site_roots: tuple[str, ...]


_READING = threading.Lock()  # held while the distributions are read


def _unlocked_in_child() -> None:
    """A child forked while the thread was reading (a process pool started right
    after the import) inherits the lock held, and no thread to release it: it
    gets its own, and reads the table itself if the parent had not finished."""
    global _READING
    _READING = threading.Lock()


os.register_at_fork(after_in_child=_unlocked_in_child)


def read_installed_in_background() -> None:
    """Read the installed distributions on a daemon thread, so the first lookup
    (the hooks frozen at a `Nitro`'s setup) finds them read; it waits for the
    thread where it has not finished. Where no thread can start (a process at its
    thread limit), the first lookup reads them itself."""
    reader = threading.Thread(
        target=_read_quietly, name="jaxnitro-installed", daemon=True
    )
    with contextlib.suppress(RuntimeError):  # "can't start new thread"
        reader.start()


def _read_quietly() -> None:
    # A failure is left to the first lookup, which reads again and raises there.
    with contextlib.suppress(Exception):
        _distributions()


def _distributions() -> tuple[_Provides, ...]:
    with _READING:
        return _read_distributions()


@functools.cache
def _read_distributions() -> tuple[_Provides, ...]:
    """Each distribution's `direct_url.json` and top-level names, read once: the
    table costs a few hundred small file reads a process, each slow on a sandboxed
    host."""
    provides = []
    for dist in importlib.metadata.distributions():
        source = _editable_source(dist)
        tops = _top_levels(dist, editable=source is not None)
        provides.append(_Provides(dist, source, frozenset(tops)))
    return tuple(provides)


@functools.cache
def _installed() -> _Installed:
    here = os.path.realpath(os.getcwd())
    cwd = None if here == os.path.dirname(here) else here  # `/`: every folder is in it
    tops: dict[str, list[_Provides]] = {}
    user_roots = []
    for provided in _distributions():
        source = provided.source
        if source is not None and _is_users_project(source, cwd):
            user_roots.append(source)  # its modules are the user's
            continue
        for top in provided.tops:
            tops.setdefault(top, []).append(provided)
    paths = sysconfig.get_paths()
    sites = [paths.get("purelib"), paths.get("platlib"), site.getusersitepackages()]
    sites += getattr(site, "getsitepackages", list)()
    return _Installed(
        cwd=cwd,
        tops={top: tuple(found) for top, found in tops.items()},
        user_roots=tuple(user_roots),
        stdlib_roots=_real_paths([paths.get("stdlib"), paths.get("platstdlib")]),
        site_roots=_real_paths(sites),
    )


def _is_users_project(source: str, cwd: str | None) -> bool:
    """Whether an editable install's source folder holds the working directory, or
    lies in it."""
    return cwd is not None and (_is_under(source, cwd) or _is_under(cwd, source))


def _real_paths(paths: list[str | None]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(os.path.realpath(p) for p in paths if p))


def _editable_source(dist: importlib.metadata.Distribution) -> str | None:
    """The source folder of an editable install (PEP 610), else None."""
    try:
        info = json.loads(dist.read_text("direct_url.json") or "null")
    except ValueError:
        return None
    if not isinstance(info, dict) or not info.get("dir_info", {}).get("editable"):
        return None
    url = urllib.parse.urlparse(str(info.get("url", "")))
    if url.scheme != "file":
        return None
    return os.path.realpath(urllib.request.url2pathname(url.path))


def _top_levels(dist: importlib.metadata.Distribution, *, editable: bool) -> set[str]:
    """The top-level module names a distribution provides; `editable`: whether it
    is an editable install (`_editable_source`)."""
    declared = dist.read_text("top_level.txt")
    if declared is not None:
        names = {line.strip().partition("/")[0] for line in declared.splitlines()}
    else:  # what its RECORD installed: `pkg/...` or `module.py`, `module.*.so`
        names = set()
        for path in _record_paths(dist):
            if not path.endswith(_MODULE_SUFFIXES):
                continue
            top, slash, _ = path.partition("/")
            if top != "..":
                names.add(top if slash else inspect.getmodulename(top) or "")
    if editable:  # the packages in the folders its .pth adds
        for folder in _pth_folders(dist):
            names.update(_modules_in(folder))
    return {name for name in names if name.isidentifier()}


def _record_paths(dist: importlib.metadata.Distribution) -> list[str]:
    """The paths `dist` installed, as its RECORD spells them. Read as CSV text:
    `dist.files` makes a `pathlib` object of every row, and the tens of thousands
    of an ML environment cost each process about 0.2 s before its first step."""
    record = dist.read_text("RECORD")
    if record is None:  # an egg-info's or a legacy install's own file list
        return [str(f) for f in dist.files or ()]
    return [row[0] for row in csv.reader(record.splitlines()) if row]


# A source file or an extension module (`x.cpython-311-x86_64-linux-gnu.so` ends
# with `.so`); not the `.pyc` files of a `__pycache__`.
_MODULE_SUFFIXES = tuple(
    dict.fromkeys(
        [
            ".py",
            *(
                "." + s.rpartition(".")[2]
                for s in importlib.machinery.EXTENSION_SUFFIXES
            ),
        ]
    )
)


def _pth_folders(dist: importlib.metadata.Distribution) -> list[str]:
    folders = []
    for f in dist.files or ():
        if f.suffix != ".pth":
            continue
        try:
            text = f.read_text()
        except (OSError, ValueError):
            continue
        base = str(dist.locate_file(""))
        for line in text.splitlines():
            line = line.strip()
            if line and not line.startswith(("#", "import ", "import\t")):
                folders.append(os.path.join(base, line))
    return folders


def _modules_in(folder: str) -> list[str]:
    try:
        entries = os.listdir(folder)
    except OSError:
        return []
    return [
        inspect.getmodulename(entry) or entry
        for entry in entries
        if os.path.isfile(os.path.join(folder, entry, "__init__.py"))
        or inspect.getmodulename(entry) is not None
    ]


@functools.lru_cache(maxsize=256)
def _installed_files(dist: importlib.metadata.Distribution) -> frozenset[str] | None:
    files = dist.files
    return None if files is None else frozenset(str(f) for f in files)


def _installed_by(provided: _Provides, name: str, real: str) -> bool:
    """Whether the module `name` at `real` is a file the distribution installed: in
    its RECORD (by its path below the import root), or under its editable source
    folder."""
    if provided.source is not None:
        return _is_under(real, provided.source)
    files = _installed_files(provided.dist)
    if files is None:  # no RECORD: trust the name
        return True
    parts = name.split(".")
    if os.path.splitext(os.path.basename(real))[0] != "__init__":
        parts = parts[:-1]
    return "/".join([*parts, os.path.basename(real)]) in files


def _is_under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _is_under_any(path: str, roots: tuple[str, ...]) -> bool:
    return any(_is_under(path, root) for root in roots)


def forget_installed() -> None:
    """Read the installed distributions and the working directory again at the next
    lookup (after an install in a running process; the tests, which move between
    folders)."""
    with _READING:  # after a read still running, which would store the old table
        _read_distributions.cache_clear()
    _installed.cache_clear()
    _installed_files.cache_clear()
    is_library_module.cache_clear()
