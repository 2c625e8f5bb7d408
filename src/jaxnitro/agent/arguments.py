"""A tool call's raw arguments checked against the tool's signature, before anything.

The MCP SDK validates a call with a pydantic model that drops arguments it does not
know and answers a wrong type with pydantic's own text. `check_arguments` runs first,
on the arguments exactly as the client sent them: an unknown name is refused by name
(with the nearest spelling and the names the tool takes), a missing required one is
named with what to pass, and a value of the wrong JSON type is named with the type
the tool takes. Every refusal is a `ConfigError` whose text a model can act on.

    >>> def nitro_stop(run: str) -> None: ...
    >>> check_arguments("nitro_stop", nitro_stop, {"run": "r1"})
    >>> check_arguments("nitro_stop", nitro_stop, {"rnu": "r1"})
    Traceback (most recent call last):
    ...
    jaxnitro.errors.ConfigError: nitro_stop has no argument `rnu`. Did you mean ...
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import ConfigError
from ..watch import did_you_mean
from .loader import json_kind
from .tools import CLIENT_KEYWORDS

# What to pass, per argument name, for the messages of a missing argument.
ARGUMENT_NOTES = {
    "run": "the id of a run this server started, such as 'r1' (nitro_train "
    "returns it; nitro_status lists them)",
    "experiment": "`path/to/file.py:ClassName`, a file under the server's root",
    "name": "the bundle's folder name, such as 'my_model_v1'",
    "run_dir": "a folder under the server's root, such as 'runs/MyExperiment'",
}

UNKNOWN_ARGUMENT = (
    "{tool} has no argument `{name}`.{near} It takes: {known}. Drop `{name}`{where}."
)
MISSING_ARGUMENT = (
    "{tool} needs the argument `{name}`: {note}. Call it with {name}=... "
    "(it takes: {known})."
)
WRONG_TYPE = (
    "{tool}: argument {name}={value} is {got}; it takes {wanted}. Pass {wanted}."
)

# Where an argument a tool does not take belongs instead: a run keyword passed
# beside the tool's arguments goes inside `keywords`.
_BELONGS = dict.fromkeys(CLIENT_KEYWORDS, "keywords")


def check_arguments(tool: str, fn: Callable[..., Any], arguments: Any) -> None:
    """Refuse arguments `fn`'s signature does not take, miss, or types otherwise.

    Args:
        tool: the tool's name, for the messages.
        fn: the tool function; its parameters and annotations are the contract.
        arguments: the call's arguments as the client sent them (a JSON object).

    Raises:
        ConfigError: `arguments` is not an object, names an argument `fn` does not
            take, lacks a required one, or holds a value of another JSON type.
    """
    if not isinstance(arguments, Mapping):
        raise ConfigError(
            f"{tool}: the arguments must be a JSON object of name -> value, got "
            f"{json_kind(arguments)}."
        )
    params = inspect.signature(fn).parameters
    hints = typing.get_type_hints(fn)
    known = ", ".join(
        n if p.default is inspect.Parameter.empty else f"{n} (optional)"
        for n, p in params.items()
    )
    for name in arguments:
        if name not in params:
            field = str(name)
            belongs = _BELONGS.get(field)
            where = (
                f", or pass it inside {belongs}={{{field!r}: ...}}"
                if belongs in params
                else ""
            )
            raise ConfigError(
                UNKNOWN_ARGUMENT.format(
                    tool=tool,
                    name=field,
                    near=did_you_mean(field, list(params)),
                    known=known or "no arguments",
                    where=where,
                )
            )
    for name, param in params.items():
        if param.default is inspect.Parameter.empty and name not in arguments:
            raise ConfigError(
                MISSING_ARGUMENT.format(
                    tool=tool,
                    name=name,
                    note=ARGUMENT_NOTES.get(name, "a value"),
                    known=known,
                )
            )
    for name, value in arguments.items():
        wanted = hints.get(name, Any)
        if not _matches(value, wanted):
            raise ConfigError(
                WRONG_TYPE.format(
                    tool=tool,
                    name=name,
                    value=_short(value),
                    got=json_kind(value),
                    wanted=describe(wanted),
                )
            )


def _matches(value: Any, hint: Any) -> bool:
    """Whether a JSON value fits an annotation (str, int, float, bool, None, a
    union of them, dict[...] or list[...]); anything else is left to the tool."""
    if hint is Any:
        return True
    if hint is None or hint is type(None):
        return value is None
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        return any(_matches(value, arm) for arm in typing.get_args(hint))
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin is dict or hint is dict:
        return isinstance(value, dict)
    if origin is list or hint is list:
        if not isinstance(value, list):
            return False
        [item] = typing.get_args(hint) or (Any,)
        return all(_matches(v, item) for v in value)
    return True


def describe(hint: Any) -> str:
    """An annotation in JSON words: "a string", "an integer or null", ..."""
    if hint is Any:
        return "any JSON value"
    if hint is None or hint is type(None):
        return "null"
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        return " or ".join(describe(arm) for arm in typing.get_args(hint))
    if origin is list or hint is list:
        [item] = typing.get_args(hint) or (Any,)
        return f"an array of {_plural(describe(item))}"
    if origin is dict or hint is dict:
        return "an object"
    return {
        bool: "true or false",
        int: "an integer",
        float: "a number",
        str: "a string",
    }.get(hint, str(hint))


def _plural(words: str) -> str:
    for article in ("an ", "a "):
        if words.startswith(article):
            return words[len(article) :] + "s"
    return words


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
