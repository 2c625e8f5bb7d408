"""Code fingerprints: a digest of what a traced function would compute.

A compiled program is only reusable while the code it traced is unchanged, so every
cache key holds the fingerprints of the hooks a program traces and, transitively, of
the user functions and classes they reach: globals they read (and the attributes they
read of user modules), what they read on `self`'s class, closures, defaults, and the
fields of user objects they reach. Functions from installed libraries (and from
jaxnitro) are named, not walked: they change only with a new process; which code is
the user's is `library_code`'s rule. User code is described without its module's
name, so code run as the main script and the same code imported from a module (in
another process) have one fingerprint. Constants are fingerprinted by value, and NumPy
and JAX arrays by content, since a traced function bakes them in; an array of Python
objects (a vocabulary, a table of labels) by the description of each element.

A value that cannot be described (one whose attributes raise, an array of more
Python objects than are described, an array no process can read whole) is named by
its type and the reason, and `fingerprint` warns once that neither the compile cache
nor the stale-handle check can see a change to it: the fingerprint never raises.
"""

from __future__ import annotations

import dataclasses
import dis
import functools
import hashlib
import types
import warnings
import weakref
from typing import Any, NamedTuple

import jax
import numpy as np

from ..errors import NitroWarning, user_stacklevel
from .library_code import is_user_code, is_user_module

# An array of Python objects is described element by element up to this many; a
# larger one (a vocabulary of millions of words) is named by its type and shape.
OBJECT_ELEMENTS_DESCRIBED = 100_000

UNDIGESTABLE_IN_KEY = (
    "jaxnitro: the compile cache cannot see the contents of a {what}, reached from "
    "{where} ({reason}). A compiled program is reused while the code is unchanged, so "
    "after a change to this value the programs that read it keep the value they were "
    "traced with. Make it a value the fingerprint can read (numbers, strings, "
    "tuples, dataclasses, NumPy arrays), pass it to the hook as an input, or call "
    "`nx.compile.cache_reset()` after changing it."
)
UNDIGESTABLE_IN_STALE_CHECK = (
    "jaxnitro: the stale-handle check cannot see a {what}, reached from {where} "
    "({reason}): a change to it will not be reported. Rebuild the `Nitro` "
    "after changing it."
)


class Undigestable(NamedTuple):
    """A value the fingerprint names by its type: what it is, why, and where."""

    what: str  # its type (and an array's dtype and shape): "numpy.ndarray object(3,)"
    reason: str  # "holds 200000 Python objects, more than the 100000 described"
    where: str  # "`module.function`" that reads it, or "the value fingerprinted"


class _CannotDescribe(Exception):
    """Raised inside the fingerprinter for a value it declines to describe."""


class _Fingerprinter:
    def __init__(self, contents: bool) -> None:
        self._memo: dict[int, str] = {}
        self._active: set[int] = set()
        self._contents = contents
        self._within: list[str] = []  # the user functions being walked, innermost last
        self.undigestable: list[Undigestable] = []

    def of(self, obj: Any, owner: type | None = None) -> str:
        key = id(obj)
        if key in self._memo:
            return self._memo[key]
        if key in self._active:
            return f"<recursive {getattr(obj, '__qualname__', type(obj).__name__)}>"
        self._active.add(key)
        try:
            digest = hashlib.sha256(self._describe(obj, owner).encode()).hexdigest()
        finally:
            self._active.discard(key)
        self._memo[key] = digest
        return digest

    def _describe(self, obj: Any, owner: type | None) -> str:
        if isinstance(obj, types.MethodType):
            bound = obj.__self__  # a classmethod is bound to the class itself
            if isinstance(bound, type):
                return "method:" + self.of(obj.__func__, bound)
            # A method of an object reads its fields: `Scaler(2.0).apply`.
            return f"method:{self.of(obj.__func__, type(bound))} on {self.value(bound)}"
        if isinstance(obj, functools.partial):
            parts = [self.value(a) for a in obj.args]
            parts += [f"{k}={self.value(v)}" for k, v in sorted(obj.keywords.items())]
            return f"partial:{self.value(obj.func)}({','.join(parts)})"
        if isinstance(obj, types.FunctionType):
            return self._function(obj, owner)
        if isinstance(obj, type):
            return self._class(obj)
        return self.value(obj)

    def _function(self, fn: types.FunctionType, owner: type | None) -> str:
        if not is_user_code(fn):
            # jax.grad, jax.vmap, jax.checkpoint: library code around the user's.
            inner = ",".join(self.value(f, owner) for f in _wrapped_code(fn))
            return f"library:{fn.__module__}.{fn.__qualname__}({inner})"
        self._within.append(f"{fn.__module__}.{fn.__qualname__}")
        try:
            return self._user_function(fn, owner)
        finally:
            self._within.pop()

    def _user_function(self, fn: types.FunctionType, owner: type | None) -> str:
        # By its qualified name within the module, not the module's name: the same
        # code run as the main script (`__main__`) and imported from its module
        # (`from model_def import *`) is the same code, and a resume must say so.
        parts = [f"fn:{fn.__qualname__}", self._code(fn.__code__)]
        # A wrapper that copied the user's name and module (jax.vmap's, a
        # decorator's) reaches the user's function through `__wrapped__`.
        parts += [f"wraps:{self.value(f, owner)}" for f in _wrapped_code(fn)]
        parts.append(f"defaults:{self.value(fn.__defaults__)}")
        parts.append(f"kwdefaults:{self.value(fn.__kwdefaults__)}")
        for cell in fn.__closure__ or ():
            try:
                parts.append(f"cell:{self.value(cell.cell_contents, owner)}")
            except ValueError:  # an empty cell
                parts.append("cell:<empty>")
        # Only the names the code loads as globals are looked up in its globals: an
        # attribute read (`self.smoothing`) must not key on a script's global of the
        # same name. Every name of co_names (attribute names included: `mod.CONST`,
        # `self.helper`) is looked up on the user modules the function reads and on
        # the owning class (code and values alike: a traced `type(self).K` bakes K
        # in).
        names = sorted(code_names(fn.__code__))
        loaded = global_names(fn.__code__)
        modules = [
            (name, module)
            for name in sorted(loaded)
            if isinstance(module := fn.__globals__.get(name), types.ModuleType)
            and is_user_module(module)
        ]
        for name in names:
            if name in loaded and name in fn.__globals__:
                # With the owner: a helper handed `self` reads its attributes too.
                described = self.value(fn.__globals__[name], owner)
                parts.append(f"global {name}:{described}")
            for alias, module in modules:
                if name in vars(module):
                    parts.append(f"{alias}.{name}:{self.value(vars(module)[name])}")
            if owner is not None and not name.startswith("__"):
                found = [b.__dict__[name] for b in owner.__mro__ if name in b.__dict__]
                if found:
                    parts.append(f"self.{name}:{self.value(found[0], owner)}")
        return "\n".join(parts)

    def _class(self, cls: type) -> str:
        if not is_user_code(cls):
            return f"library class:{cls.__module__}.{cls.__qualname__}"
        parts = [f"class:{cls.__qualname__}"]  # no module name, as for a function
        parts += [f"base:{self.value(base)}" for base in cls.__bases__]
        for name, attr in sorted(cls.__dict__.items()):
            if _is_code_like(attr):
                parts.append(f"{name}:{self.value(attr, cls)}")
            elif name.startswith("__") or name == "_jaxnitro_meta":
                continue
            else:
                parts.append(f"{name}={self.value(attr)}")
        return "\n".join(parts)

    def _code(self, code: types.CodeType) -> str:
        consts = [
            self._code(c) if isinstance(c, types.CodeType) else _const_repr(c)
            for c in code.co_consts
        ]
        # The argument names too: swapping two parameters' names (and the body's
        # uses with them) leaves the bytecode as it was, but not a keyword call.
        arguments = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        return "|".join(
            [
                code.co_code.hex(),
                ",".join(consts),
                ",".join(code.co_names),
                ",".join(arguments),
                str(code.co_flags),
            ]
        )

    def value(self, value: Any, owner: type | None = None) -> str:
        """A stable description of a value a traced function may depend on; one that
        cannot be described is named by its type, and noted in `undigestable`."""
        try:
            return self._value(value, owner)
        except Exception as error:  # whatever it is, the fingerprint goes on
            return self._undigestable(value, error)

    def _value(self, value: Any, owner: type | None) -> str:
        if isinstance(value, staticmethod | classmethod):
            value = value.__func__
        if isinstance(value, property):
            return "property:" + ",".join(
                self.value(f, owner) for f in (value.fget, value.fset) if f is not None
            )
        if value is None or isinstance(value, bool | int | float | complex | str):
            return f"{type(value).__name__}:{value!r}"
        if isinstance(value, bytes):
            return "bytes:" + hashlib.sha256(value).hexdigest()
        if isinstance(value, tuple):
            inner = ",".join(self.value(v) for v in value)
            return f"{type(value).__name__}({inner})"
        if isinstance(value, frozenset):  # sorted: its order follows string hashes
            return f"frozenset({','.join(sorted(self.value(v) for v in value))})"
        if isinstance(value, list | dict | set | np.ndarray) and not self._contents:
            return f"mutable {type(value).__name__}"
        if isinstance(value, list):
            return f"list({','.join(self.value(v) for v in value)})"
        if isinstance(value, set):
            return f"set({','.join(sorted(self.value(v) for v in value))})"
        if isinstance(value, dict):
            items = sorted(f"{self.value(k)}:{self.value(v)}" for k, v in value.items())
            return f"dict({','.join(items)})"
        if isinstance(value, jax.Array) and not self._contents:
            return f"array:{value.dtype}{value.shape}"
        if isinstance(value, np.ndarray | np.generic | jax.Array):
            if isinstance(value, jax.Array) and value.is_deleted():
                return f"deleted array@{id(value)}"
            # By content, whatever the size: an address can be reused by another
            # array once the first is freed. A JAX array cannot change, so its
            # digest is kept; a NumPy array may be written in place, so it is not.
            if isinstance(value, jax.Array):
                return _jax_array_digest(value)
            array = np.asarray(value)
            if array.dtype.hasobject:
                return self._object_array(array)
            return _array_digest(array)
        if isinstance(value, types.ModuleType):
            return f"module:{value.__name__}"
        if _is_code_like(value) or isinstance(value, type):
            return self.of(value, owner)
        kind = type(value)
        wrapped = _wrapped_code(value)
        if wrapped:  # jax.jit, custom_jvp/vjp, functools.wraps: the code inside
            inner = ",".join(self.value(f, owner) for f in wrapped)
            return f"wrapper {kind.__module__}.{kind.__qualname__}({inner})"
        if isinstance(value, types.SimpleNamespace):
            return f"namespace {{{self._state(value)}}}"
        if is_user_code(kind):
            if not self._contents:  # the stale check: code, not state
                return f"instance of {self.of(kind)}"
            return f"instance of {self.of(kind)} {{{self._state(value)}}}"
        return f"object:{kind.__module__}.{kind.__qualname__}"

    def _object_array(self, array: np.ndarray) -> str:
        """An array of Python objects, by the description of each element: a
        vocabulary that changes must change the key, and its bytes are addresses."""
        if array.size > OBJECT_ELEMENTS_DESCRIBED:
            raise _CannotDescribe(
                f"holds {array.size} Python objects, more than the "
                f"{OBJECT_ELEMENTS_DESCRIBED} described"
            )
        # tolist(): the elements themselves (a structured array's rows as tuples).
        text = ",".join(self.value(item) for item in array.ravel().tolist())
        digest = hashlib.blake2b(text.encode(), digest_size=16).hexdigest()
        return f"array:{array.dtype}{array.shape}:objects {digest}"

    def _undigestable(self, value: Any, error: Exception) -> str:
        kind = type(value)
        what = f"{kind.__module__}.{kind.__qualname__}"
        if isinstance(value, np.ndarray | jax.Array):
            what += f" {value.dtype}{value.shape}"
        # The description keys programs and is kept in checkpoint records, so it
        # holds the reason's kind, never its text (which may hold an address).
        if isinstance(error, _CannotDescribe):
            short = reason = str(error)
        else:
            short, reason = type(error).__name__, f"{type(error).__name__}: {error}"
        where = f"`{self._within[-1]}`" if self._within else "the value fingerprinted"
        self.undigestable.append(Undigestable(what, reason, where))
        return f"undigestable {what}: {short}"

    def _state(self, obj: Any) -> str:
        """A user object's fields (a dataclass's, or its `__dict__` and slots): a
        traced function that reads `config.scale` bakes the value in."""
        key = id(obj)
        if key in self._active:
            return f"<recursive {type(obj).__qualname__}>"
        self._active.add(key)
        try:
            if dataclasses.is_dataclass(obj):
                names = [f.name for f in dataclasses.fields(obj)]
            else:
                names = sorted(getattr(obj, "__dict__", {}))
                for klass in type(obj).__mro__:
                    slots = klass.__dict__.get("__slots__", ())
                    names += [slots] if isinstance(slots, str) else list(slots)
            return ",".join(
                f"{name}={self.value(getattr(obj, name))}"
                for name in names
                if hasattr(obj, name)
            )
        finally:
            self._active.discard(key)


def _const_repr(const: Any) -> str:
    """A code constant's repr, the same in every process: a frozenset (what `x in
    {"a", "b"}` compiles to) iterates in an order that follows the per-process
    string hash, so its items are sorted."""
    if isinstance(const, frozenset):
        return f"frozenset({{{', '.join(sorted(map(_const_repr, const)))}}})"
    if isinstance(const, tuple):
        return f"({', '.join(map(_const_repr, const))},)"
    return repr(const)


def _array_digest(array: np.ndarray) -> str:
    array = np.ascontiguousarray(array)
    data = array.reshape(-1).view(np.uint8).data
    digest = hashlib.blake2b(data, digest_size=16).hexdigest()
    return f"array:{array.dtype}{array.shape}:{digest}"


_JAX_DIGESTS: dict[int, tuple[weakref.ref[Any], str]] = {}


def _jax_array_digest(array: jax.Array) -> str:
    """An immutable array's digest, computed once while it lives (a global read by
    traced code is keyed again for every program of every handle)."""
    held = _JAX_DIGESTS.get(id(array))
    if held is not None and held[0]() is array:
        return held[1]
    digest = _array_digest(np.asarray(array))
    key = id(array)
    try:
        ref = weakref.ref(array, lambda _: _forget(key))
    except TypeError:  # not weakly referenceable: no memo
        return digest
    _JAX_DIGESTS[key] = (ref, digest)
    return digest


def _forget(key: int) -> None:
    held = _JAX_DIGESTS.get(key)
    if held is not None and held[0]() is None:  # not a newer array at that address
        _JAX_DIGESTS.pop(key, None)


def _wrapped_code(value: Any) -> list[Any]:
    """The functions a library wrapper calls: `__wrapped__` (jax.jit, jax.checkpoint,
    functools.wraps), and a custom_jvp's or custom_vjp's function and rules."""
    found = [getattr(value, "__wrapped__", None)]
    if callable(value):
        found += [getattr(value, name, None) for name in ("fun", "jvp", "fwd", "bwd")]
    return [f for f in found if callable(f)]


def _is_code_like(value: Any) -> bool:
    return isinstance(
        value,
        types.FunctionType
        | types.MethodType
        | functools.partial
        | staticmethod
        | classmethod
        | property,
    )


def code_names(code: types.CodeType) -> set[str]:
    """Every global and attribute name the code (and its nested code) loads."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= code_names(const)
    return names


_GLOBAL_LOADS = frozenset({"LOAD_GLOBAL", "LOAD_NAME"})


@functools.lru_cache(maxsize=4096)
def global_names(code: types.CodeType) -> frozenset[str]:
    """The names the code (and its nested code) loads as globals (LOAD_GLOBAL,
    LOAD_NAME), without the attribute and method names (LOAD_ATTR, LOAD_METHOD)
    that co_names holds beside them.

    Examples:
        >>> def f(self):
        ...     return self.scale * SCALE
        >>> sorted(global_names(f.__code__)), sorted(f.__code__.co_names)
        (['SCALE'], ['SCALE', 'scale'])
    """
    # `argval` is the name itself: LOAD_GLOBAL's raw argument also encodes
    # whether a NULL is pushed (namei << 1 | flag on 3.11+), which dis decodes.
    names = {
        instruction.argval
        for instruction in dis.get_instructions(code)
        if instruction.opname in _GLOBAL_LOADS
    }
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= global_names(const)
    return frozenset(names)


def fingerprint(*objects: Any, owner: type | None = None, contents: bool = True) -> str:
    """One digest of the code behind `objects` (functions, methods, classes, values).

    With `contents=False`, mutable containers and arrays count by type only: the
    stale-handle check asks whether code changed, not whether a list it closes over
    was appended to. Cache keys keep the default, since a traced hook bakes in what
    it reads.

    Examples:
        >>> def f(x): return x + 1
        >>> def g(x): return x + 2
        >>> fingerprint(f) == fingerprint(f), fingerprint(f) == fingerprint(g)
        (True, False)
    """
    printer = _Fingerprinter(contents)
    text = "\n".join(printer.value(obj, owner) for obj in objects)
    for seen in printer.undigestable:
        _warn_undigestable(seen, contents=contents)
    return hashlib.sha256(text.encode()).hexdigest()


_WARNED: set[tuple[bool, Undigestable]] = set()


def _warn_undigestable(seen: Undigestable, *, contents: bool) -> None:
    """Warn, once a process for each value and purpose, that a fingerprint cannot
    see a value (a cache key is taken for every program, the stale check for every
    verb)."""
    if (contents, seen) in _WARNED:
        return
    _WARNED.add((contents, seen))
    template = UNDIGESTABLE_IN_KEY if contents else UNDIGESTABLE_IN_STALE_CHECK
    text = template.format(what=seen.what, reason=seen.reason, where=seen.where)
    warnings.warn(text, NitroWarning, stacklevel=user_stacklevel())
