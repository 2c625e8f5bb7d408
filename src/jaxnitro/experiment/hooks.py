"""Reading an experiment's hooks: which exist, and freezing them at construction.

A `Nitro` freezes the hook code it will run: each hook function is copied, and so is
every user function it calls, so an in-place reload (IPython's autoreload patches
`__code__`) cannot change what an existing handle runs. The fingerprints taken at the
same moment let the handle report a redefinition later.
"""

from __future__ import annotations

import inspect
import sys
import types
from collections.abc import Callable, Iterable
from typing import Any

from ..errors import ConfigError, HookError
from ..keys.fingerprint import code_names, fingerprint
from ..keys.library_code import is_user_code
from .base import Experiment
from .traits import field_names

REQUIRED_HOOKS = ("build_model", "build_data", "forward", "loss")
# Hooks a handle calls after construction; frozen with it.
RUNTIME_HOOKS = ("forward", "loss", "metrics", "train_metrics", "finalize_metrics")
# Hooks setup calls for the optimizer; what they return is fixed in the handle's plan.
OPTIMIZER_HOOKS = ("param_group", "optimizer", "no_decay", "grad_rule", "no_perturb")
# Manual mode's hooks: train_step is frozen with the handle when it trains manually.
MANUAL_HOOKS = ("manual_training", "train_step", "setup_optimizers")
# Every hook whose redefinition makes a handle stale.
WATCHED_HOOKS = (
    "build_model",
    "build_data",
    "derive",
    *RUNTIME_HOOKS,
    *OPTIMIZER_HOOKS,
    *MANUAL_HOOKS,
)
_DEFAULTED = ("finalize_metrics", "derive")


def has_hook(cls: type, name: str) -> bool:
    """Whether the experiment class provides hook `name` (beyond a base default)."""
    if issubclass(cls, Experiment) and name in _DEFAULTED:
        return any(name in k.__dict__ for k in cls.__mro__ if k is not Experiment)
    return callable(getattr(cls, name, None))


def filename_hook(experiment: Any) -> Callable[..., str] | None:
    """The experiment's `checkpoint_filename` as a Checkpointer's name function.

    The method is looked up on the class at every call, so one redefined on a
    live run's class names its next record. None for a class without the hook.
    """
    cls = type(experiment)
    if not callable(getattr(cls, "checkpoint_filename", None)):
        return None

    def filename(**names: Any) -> str:
        return hook_function(cls, "checkpoint_filename")(experiment, **names)  # type: ignore[no-any-return]

    return filename


def hook_function(cls: type, name: str) -> Callable[..., Any]:
    """The function implementing hook `name`, called as `fn(experiment, ...)`."""
    if has_hook(cls, name):
        attr = cls.__dict__.get(name)
        for klass in cls.__mro__:
            if name in klass.__dict__:
                attr = klass.__dict__[name]
                break
        if isinstance(attr, staticmethod):
            return _ignoring_self(attr.__func__)
        if isinstance(attr, classmethod):
            return _ignoring_self(attr.__get__(None, cls))
        return attr  # type: ignore[no-any-return,return-value]
    return getattr(Experiment, name)  # type: ignore[no-any-return]


def _ignoring_self(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` called as a hook, `hook(experiment, ...)`, dropping the experiment.

    The wrapper carries `fn`'s signature with a leading `_self`: routing reads the
    batch fields a hook declares from its signature, and the wrapper's own
    `(*args, **kwargs)` would declare every field. It also carries `fn`'s module, so
    the code fingerprint counts it as user code and follows its closure into `fn`:
    as a jaxnitro function it would fingerprint by name alone, and an edit to `fn`
    would reuse the program compiled from the old code.
    """

    def hook(_self: Any, *args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    signature = inspect.signature(fn)
    first = inspect.Parameter("_self", inspect.Parameter.POSITIONAL_ONLY)
    hook.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[first, *signature.parameters.values()]
    )
    hook.__name__ = getattr(fn, "__name__", hook.__name__)
    hook.__qualname__ = getattr(fn, "__qualname__", hook.__qualname__)
    hook.__module__ = getattr(fn, "__module__", hook.__module__)
    return hook


# The spec's `checkpoint_filename(e; epoch, step, metric, score)` is a function of each
# record: a field of that name would shadow the method and name nothing, so it is
# refused (one fixed name would also overwrite every kept record with the next).
CHECKPOINT_FILENAME_FIELD = (
    "{cls} has a field `checkpoint_filename` (= {value}), but checkpoint_filename is "
    "a hook, not a value: the checkpointer calls it at every write with that "
    "record's epoch, step, metric and score, and a field of that name would shadow "
    "it and be ignored. Rename the field and define the method, e.g. `def "
    "checkpoint_filename(self, *, epoch, step, metric=None, score=None, **names): "
    'return f"e{{epoch:04d}}-s{{step}}.safetensors"`, or pass '
    "Nitro(..., checkpointer=Checkpointer(name=...)) with a name function."
)


def refuse_hook_fields(experiment: Any) -> None:
    """Refuse a field named like a hook that no field can stand in for.

    Raises:
        ConfigError: the class has a field `checkpoint_filename`.
    """
    cls = type(experiment)
    if "checkpoint_filename" in field_names(cls):
        value = getattr(experiment, "checkpoint_filename", None)
        text = repr(value)
        text = text if len(text) <= 60 else text[:57] + "..."
        raise ConfigError(
            CHECKPOINT_FILENAME_FIELD.format(cls=cls.__name__, value=text)
        )


def check_required_hooks(cls: type, *, has_data: bool) -> None:
    """Raise naming the first required hook the class lacks."""
    for name in REQUIRED_HOOKS:
        if name == "build_data" and has_data:
            continue
        if not has_hook(cls, name):
            raise HookError(
                f"{cls.__name__} does not define the required hook `{name}`. "
                f"Every experiment defines build_model, build_data, forward and loss "
                f"(build_data may be replaced by Nitro(e, data=...))."
            )


def freeze_hooks(cls: type, names: Iterable[str]) -> dict[str, Callable[..., Any]]:
    """Copies of hooks `names` of `cls` and of every user function they reach.

    Each copy reads a copy of its module's globals (one per module, shared by the
    copies from that module), in which the user functions it names are copies too,
    and so on down; closure cells holding user functions get copies as well. So an
    in-place edit of a helper (IPython's autoreload patches `__code__`) or a reload
    rebinding it cannot change what the handle traces for a program it compiles
    later. What the hooks read through `self` (methods, class attributes) stays the
    class's own: a program compiled later reads it as it is then, and the cache key
    sees it, so no program is ever served for other code. Library functions are not
    copied. One consequence: a `global` statement in a hook or a helper assigns in
    the handle's copy of the module's globals, not in the module.
    """
    freezer = _Freezer()
    return {name: freezer.copy(hook_function(cls, name)) for name in names}


class _Freezer:
    def __init__(self) -> None:
        self._functions: dict[int, types.FunctionType] = {}
        self._globals: dict[int, dict[str, Any]] = {}

    def copy(self, fn: Any) -> Any:
        if not isinstance(fn, types.FunctionType):
            return fn
        done = self._functions.get(id(fn))
        if done is not None:
            return done
        scope = self._globals.get(id(fn.__globals__))
        if scope is None:
            scope = self._globals[id(fn.__globals__)] = dict(fn.__globals__)
        cells, pending = self._cells(fn)
        copy = types.FunctionType(
            fn.__code__, scope, fn.__name__, fn.__defaults__, cells
        )
        copy.__kwdefaults__ = fn.__kwdefaults__
        copy.__qualname__ = fn.__qualname__
        copy.__module__ = fn.__module__
        copy.__dict__.update(fn.__dict__)
        copy.__wrapped_original__ = fn  # type: ignore[attr-defined]
        self._functions[id(fn)] = copy  # before the callees: recursion ends here
        for cell, value in pending:
            cell.cell_contents = self.copy(value)
        for name in code_names(fn.__code__):
            value = scope.get(name)
            if self._follows(value):
                scope[name] = self.copy(value)
        return copy

    def _cells(
        self, fn: types.FunctionType
    ) -> tuple[tuple[types.CellType, ...] | None, list[tuple[types.CellType, Any]]]:
        """The closure for `fn`'s copy: a new, still empty cell where a user function
        sits (a wrapper's closure holds the function it calls: a staticmethod hook's,
        a decorator's), filled once the copy is memoized, since the function may be
        `fn` itself (a recursive closure); the other cells as they are."""
        if fn.__closure__ is None:
            return None, []
        cells: list[types.CellType] = []
        pending: list[tuple[types.CellType, Any]] = []
        for cell in fn.__closure__:
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell (a name assigned later)
                cells.append(cell)
                continue
            if self._follows(value):
                cells.append(types.CellType())
                pending.append((cells[-1], value))
            else:
                cells.append(cell)
        return tuple(cells), pending

    @staticmethod
    def _follows(value: Any) -> bool:
        return isinstance(value, types.FunctionType) and is_user_code(value)


def current_class(cls: type) -> type:
    """The class as its module defines it now (after a reload), else `cls` itself."""
    module = sys.modules.get(cls.__module__)
    if module is None or "<locals>" in cls.__qualname__:
        return cls
    found: Any = module
    for part in cls.__qualname__.split("."):
        found = getattr(found, part, None)
        if found is None:
            return cls
    return found if isinstance(found, type) else cls


def hook_fingerprints(cls: type) -> dict[str, str]:
    """The fingerprint of every watched hook the class has (code and callees)."""
    return {
        name: fingerprint(hook_function(cls, name), owner=cls, contents=False)
        for name in WATCHED_HOOKS
        if has_hook(cls, name)
    }
