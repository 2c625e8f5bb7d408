"""Experiments named by an agent: `path/to/file.py:ClassName`, resolved under a root.

The MCP server reads and writes nothing outside its root. A client names an
experiment as a Python file under the root and a class in it; the file is imported as
a module under a fresh name (the only code the server ever runs for a client), the
class is picked, and the preset and overrides are applied through the experiment's own
field checks. Override values are JSON scalars taken as given, never evaluated.

    >>> import tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> under_root(root, "../etc/passwd")
    Traceback (most recent call last):
    ...
    jaxnitro.errors.ConfigError: path '../etc/passwd' resolves to ..., outside ...
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import threading
import types
import typing
from pathlib import Path
from types import ModuleType
from typing import Any

from ..errors import ConfigError, NitroError, NotYetSupportedError
from ..experiment.base import Experiment
from ..experiment.named_presets import from_preset
from ..experiment.traits import NO_DEFAULT, config_metadata
from ..experiment.view import check_field_names

OUTSIDE_ROOT = (
    "path {path!r} resolves to {resolved}, outside the server's root {root} "
    "(symbolic links are followed). The agent server reads and writes only under its "
    "root: pass a path relative to it, or start `nitro mcp --root DIR` higher up."
)
BAD_NAME = (
    "experiment {name!r} is not of the form `path/to/file.py:ClassName`. Name a "
    "Python file under the server's root and the Experiment subclass in it, e.g. "
    '"experiments/mnist.py:MnistMLP".'
)
NOT_SCALAR = (
    "override {key}={value!r} is a {kind}; overrides are JSON scalars (a number, a "
    "string, true/false or null), set on the experiment's field as given. Pass one "
    "value per field."
)
SCALARS = (bool, int, float, str, type(None))

_import_lock = threading.Lock()


def under_root(root: str | os.PathLike[str], path: str | os.PathLike[str]) -> Path:
    """`path` (relative to `root`, or absolute) resolved, refused outside `root`.

    Symbolic links are resolved first, so a link that points out of the root is
    refused like a `..` that climbs out of it.

    Raises:
        ConfigError: the resolved path is not `root` or inside it.
    """
    base = Path(root).resolve()
    resolved = (base / Path(path)).resolve()
    if resolved != base and base not in resolved.parents:
        raise ConfigError(
            OUTSIDE_ROOT.format(path=str(path), resolved=resolved, root=base)
        )
    return resolved


def experiment_class(root: str | os.PathLike[str], name: str) -> type[Experiment]:
    """Import the file `name` names (`file.py:ClassName`) and return its class.

    Each call imports the file afresh, so an edited file is read again, under a
    module name fixed by its path: the compile cache keys a class by module and
    qualname, so a second run of unchanged hooks hits it.

    Raises:
        NotYetSupportedError: a run file (`.sx`), until run files can be run.
        ConfigError: a malformed name, a path outside the root, a missing file, a
            file that fails to import (its error quoted), a missing class, or a class
            that is not an Experiment subclass.
    """
    if str(name).endswith(".sx"):
        raise NotYetSupportedError(
            f"experiment {name!r} is a run file; the agent server runs run files "
            f"once `sexpgpu run` lands. Name a Python experiment instead: "
            f"`path/to/file.py:ClassName`."
        )
    file_part, sep, class_name = str(name).rpartition(":")
    if not sep or not file_part.endswith(".py") or not class_name.isidentifier():
        raise ConfigError(BAD_NAME.format(name=name))
    path = under_root(root, file_part)
    if not path.is_file():
        raise ConfigError(
            f"experiment file {file_part!r} does not exist under the server's root "
            f"({path}). Pass a path relative to the root."
        )
    module = _import_file(path, Path(root).resolve())
    cls = getattr(module, class_name, None)
    if cls is None:
        found = sorted(
            n
            for n, v in vars(module).items()
            if isinstance(v, type) and issubclass(v, Experiment) and v is not Experiment
        )
        raise ConfigError(
            f"{file_part} has no class {class_name!r}. Experiment classes in it: "
            f"{', '.join(found) or 'none'}."
        )
    if not (isinstance(cls, type) and issubclass(cls, Experiment)):
        raise ConfigError(
            f"{file_part}:{class_name} is a {type(cls).__name__}, not a subclass of "
            f"jaxnitro.Experiment. Name the experiment class."
        )
    return cls


def build_experiment(
    cls: type[Experiment],
    preset: str | None = None,
    overrides: dict[str, Any] | None = None,
) -> Experiment:
    """An instance of `cls`: its preset (if named) with `overrides` winning.

    Raises:
        ConfigError: an unknown preset, an unknown field, a value that is not a JSON
            scalar, one of another type than the field's declared int, float, bool
            or str, one outside the field's declared range (`field(ge=, le=)`), or
            one the experiment refuses otherwise (its own message).
    """
    values = dict(overrides or {})
    for key, value in values.items():
        if not isinstance(value, SCALARS):
            raise ConfigError(
                NOT_SCALAR.format(key=key, value=value, kind=type(value).__name__)
            )
    check_field_names(cls, values, "The override", "Pass field names of the class.")
    meta = config_metadata(cls)
    for key, value in values.items():
        check_override_type(cls.__name__, key, meta[key], value)
    try:
        if preset is not None:
            return from_preset(cls, preset, **values)
        return cls(**values)
    except NitroError:
        raise
    except Exception as error:
        raise ConfigError(
            f"building {cls.__name__} with overrides {values!r} raised "
            f"{type(error).__name__}: {error}. Fix the values (or the class)."
        ) from error


# A declared scalar type, what a JSON value of it is, and an example of one.
_SCALAR_TYPES: dict[Any, tuple[str, Any]] = {
    int: ("a whole number", 4),
    float: ("a number", 0.5),
    bool: ("true or false", True),
    str: ("a string", "'text'"),
}


def _scalar_arms(meta: Any) -> tuple[tuple[Any, ...], list[Any]]:
    """`(arms, scalars)` of a field's declared type: its union's members (the type
    itself when it is no union), and those among int, float, bool and str; the
    scalars are empty unless every arm is one of them or None."""
    declared = meta.type
    arms = (
        typing.get_args(declared)
        if typing.get_origin(declared) in (typing.Union, types.UnionType)
        else (declared,)
    )
    scalars = [a for a in arms if a in _SCALAR_TYPES]
    if len(scalars) + (type(None) in arms) != len(arms):
        return arms, []
    return arms, scalars


def check_override_type(owner: str, key: str, meta: Any, value: Any) -> None:
    """Refuse an override whose JSON type is not the field's declared scalar type.

    Only the declared types int, float, bool and str (and their `| None`) are
    checked here; a field of another type is left to the experiment's own checks.
    A whole float is a whole number (3.0 for an int); an int is a number.

    Raises:
        ConfigError: the value's type is not the declared one, or it is null for a
            field that does not take None.
    """
    arms, scalars = _scalar_arms(meta)
    if not scalars:
        return  # not (only) scalar types: the experiment's own checks decide
    if value is None:
        if type(None) in arms or meta.default is None:
            return
    elif any(_fits(value, a) for a in scalars):
        return
    words, example = _SCALAR_TYPES[scalars[0]]
    if any(_fits(meta.default, a) for a in scalars):
        example = f"{meta.default!r} (its default)"
    shown = " or ".join(getattr(a, "__name__", str(a)) for a in arms)
    raise ConfigError(
        f"override {key}={value!r}: {owner}.{key} is declared {shown}, so it takes "
        f"{words}, not {json_kind(value)}. Pass e.g. {key}={example}."
    )


BAD_TEXT = (
    "--set {key}={text!r}: {owner}.{key} is a {kind} field declared {shown}, so it "
    "takes {words}; {text!r} is not one. Pass e.g. --set {key}={example}."
)
NOT_TEXT_TYPE = (
    "--set {key}={text!r}: {owner}.{key} is declared {shown}; --set parses int, "
    "float, bool and str fields (and their `| None`). Set it in a preset or a "
    "subclass instead."
)
_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")
_NONE = ("none", "null")
_KIND_NAMES = {"graphconst": "GraphConst", "device": "Device", "host": "Host"}


def parse_override_text(cls: type[Experiment], key: str, text: str) -> Any:
    """The value `text` (a command line's `--set key=text`) for `cls`'s field `key`.

    The text is parsed by the field's declared type inside its marker (GraphConst,
    Device or Host): an int (`1_000` too), a float (`1e-3`, `inf`), a bool (true,
    false, yes, no, on, off, 1, 0), a str (the text as given), or None (`none`,
    `null`) for a field that takes None. The value is then an override like a JSON
    one: `build_experiment` checks its type, range and the experiment's own rules.

    Raises:
        ConfigError: `key` is no field of `cls` (the nearest names given), the
            field's type is not a scalar one, or the text is not of its type (the
            field, the text and the type named).

    Examples:
        >>> import jaxnitro as nx
        >>> class Exp(nx.Experiment):
        ...     width: nx.GraphConst[int] = 8
        ...     lr: nx.Device[float] = 0.1
        >>> parse_override_text(Exp, "width", "16")
        16
        >>> parse_override_text(Exp, "lr", "1e-2")
        0.01
    """
    check_field_names(
        cls, [key], "--set", "Pass `--set FIELD=VALUE` with a field of the class."
    )
    meta = config_metadata(cls)[key]
    arms, scalars = _scalar_arms(meta)
    takes_none = type(None) in arms or meta.default is None
    shown = " | ".join(getattr(a, "__name__", str(a)) for a in arms)
    if not scalars:
        raise ConfigError(
            NOT_TEXT_TYPE.format(key=key, text=text, owner=cls.__name__, shown=shown)
        )
    if takes_none and text.strip().lower() in _NONE:
        return None
    for arm in scalars:
        value = _from_text(arm, text)
        if value is not _NO_VALUE:
            return value
    words, example = _SCALAR_TYPES[scalars[0]]
    if meta.default is not None and meta.default is not NO_DEFAULT:
        example = meta.default
    raise ConfigError(
        BAD_TEXT.format(
            key=key,
            text=text,
            owner=cls.__name__,
            kind=_KIND_NAMES.get(meta.kind, meta.kind),
            shown=shown,
            words=words,
            example=str(example).lower() if isinstance(example, bool) else example,
        )
    )


_NO_VALUE: Any = object()


def _from_text(declared: Any, text: str) -> Any:
    """`text` as a `declared` (int, float, bool or str), or `_NO_VALUE`."""
    if declared is str:
        return text
    word = text.strip().lower()
    if declared is bool:
        if word in _TRUE:
            return True
        return False if word in _FALSE else _NO_VALUE
    try:
        return int(word) if declared is int else float(word)
    except ValueError:
        return _NO_VALUE


def _fits(value: Any, declared: Any) -> bool:
    if declared is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if declared is int:
        return isinstance(value, int) or (
            isinstance(value, float) and value.is_integer()
        )
    if declared is float:
        return isinstance(value, int | float)
    return isinstance(value, declared)


def json_kind(value: Any) -> str:
    """What a JSON value is, in words: "null", "an integer", "a fraction" (a
    float that is no whole number), "an array", ...

    >>> [json_kind(v) for v in (None, 3, 2.5, 2.0, [1], {})]
    ['null', 'an integer', 'a fraction', 'a number', 'an array', 'an object']
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a fraction" if not value.is_integer() else "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"


def module_name_for(path: Path, root: Path) -> str:
    """The module name a file under `root` is imported as: stable for one path,
    distinct between paths (a hash of the path relative to the root)."""
    relative = path.relative_to(root).as_posix()
    digest = hashlib.sha256(relative.encode()).hexdigest()[:10]
    stem = "".join(c if c.isalnum() else "_" for c in path.stem)
    return f"jaxnitro_agent_{stem}_{digest}"


def _import_file(path: Path, root: Path) -> ModuleType:
    """Import `path` afresh as the module `module_name_for(path, root)`."""
    module_name = module_name_for(path, root)
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"{path} cannot be imported as a Python module.")
    module = importlib.util.module_from_spec(spec)
    # Registered before running, as dataclasses and the code fingerprints look a
    # class's module up through sys.modules by its __module__. A run that holds the
    # previous import keeps its own classes.
    with _import_lock:
        previous = sys.modules.get(module_name)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except (Exception, SystemExit) as error:
            if previous is None:
                del sys.modules[module_name]
            else:
                sys.modules[module_name] = previous
            raise ConfigError(
                f"importing {path} raised {type(error).__name__}: {error}. Fix "
                f"the file and start the run again."
            ) from error
    return module
