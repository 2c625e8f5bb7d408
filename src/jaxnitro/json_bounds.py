"""JSON from an untrusted source, bounded in size and nesting before it is parsed.

Python's `json` module parses nested arrays and objects recursively: a document
nested a few thousand levels deep raises `RecursionError` (or worse, exhausts the C
stack), and it allocates the whole document as Python objects. `loads_bounded`
refuses a document over a byte limit or a nesting limit first, with a scan that
allocates nothing per level: backslash escapes and strings are removed (a bracket
inside a string does not nest), then the nesting depth is the largest running sum
of the brackets that remain.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

_KEEP = b'"[]{}'
_DELETE = bytes(b for b in range(256) if b not in _KEEP)
_STRING = re.compile(rb'"[^"]*"')


class JSONRefused(ValueError):
    """A JSON document is refused: over a limit, not UTF-8, or not valid JSON."""


def json_depth(data: bytes) -> int:
    """The deepest nesting of arrays and objects in the JSON text `data`.

    Exact for valid JSON; for invalid JSON, at least the depth a parser reaches
    before it stops at the first error.

    Examples:
        >>> json_depth(b'{"a": [[1, 2], "]]]]"]}')
        3
    """
    # An escaped backslash first, then an escaped quote: what is left of a string
    # holds no quote, so one regular expression removes every string.
    text = data.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _DELETE)
    brackets = np.frombuffer(_STRING.sub(b"", text).replace(b'"', b""), np.uint8)
    if brackets.size == 0:
        return 0
    opens = (brackets == ord("[")) | (brackets == ord("{"))
    steps = np.where(opens, 1, -1).astype(np.int64)
    return int(max(np.cumsum(steps).max(), 0))


def loads_bounded(data: bytes, *, max_bytes: int, max_depth: int, what: str) -> Any:
    """Parse the JSON text `data` once its size and nesting are within limits.

    Args:
        data: the document's bytes (UTF-8).
        max_bytes: the most bytes accepted.
        max_depth: the deepest nesting of arrays and objects accepted.
        what: the document, as the messages name it ("manifest.json").

    Returns:
        The parsed value. An object with a key given twice is refused rather than
        silently keeping the last value.

    Raises:
        JSONRefused: over a limit, not UTF-8, not valid JSON, or a repeated key;
            the message names `what`, the limit or the parser's position.

    Examples:
        >>> loads_bounded(b'{"a": [1]}', max_bytes=100, max_depth=4, what="x")
        {'a': [1]}
        >>> loads_bounded(b"[" * 50, max_bytes=100, max_depth=4, what="the body")
        ... # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        jaxnitro.json_bounds.JSONRefused: the body nests 50 levels deep; ...
    """
    if len(data) > max_bytes:
        raise JSONRefused(
            f"{what} is {len(data)} bytes; at most {max_bytes} are accepted."
        )
    # Fewer brackets than the limit cannot nest past it: small bodies skip the scan.
    opening = data.count(b"[") + data.count(b"{")
    depth = json_depth(data) if opening > max_depth else 0
    if depth > max_depth:
        raise JSONRefused(
            f"{what} nests {depth} levels deep; at most {max_depth} are accepted."
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise JSONRefused(f"{what} is not UTF-8 text ({error}).") from error
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except RecursionError as error:  # not reached below max_depth; kept as a guard
        raise JSONRefused(f"{what} nests too deeply to parse.") from error
    except ValueError as error:  # JSONDecodeError, an integer past 4300 digits
        raise JSONRefused(f"{what} is not valid JSON ({error}).") from error


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"the key {key!r} appears twice in one object")
        result[key] = value
    return result
