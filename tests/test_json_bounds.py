"""json_bounds: the nesting scan agrees with the parsed document's depth (brackets
and escapes inside strings included), and each limit is refused before parsing."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxnitro.json_bounds import JSONRefused, json_depth, loads_bounded

TEXT = st.text(alphabet='[]{}"\\ab,:\n\u00e9', max_size=8)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3)
    ),
    max_leaves=30,
)


def depth(value):
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    return 0


@settings(max_examples=300, deadline=None)
@given(JSON, st.booleans())
def test_the_scan_finds_the_parsed_depth(value, ascii_only):
    text = json.dumps(value, ensure_ascii=ascii_only).encode()
    assert json_depth(text) == depth(value)


def test_each_limit_is_refused_by_name():
    with pytest.raises(JSONRefused, match=r"^doc is 11 bytes; at most 10 are"):
        loads_bounded(b"[1, 2, 3, 4]"[:11], max_bytes=10, max_depth=5, what="doc")
    with pytest.raises(JSONRefused, match=r"^doc nests 6 levels deep; at most 5"):
        loads_bounded(b"[[[[[[]]]]]]", max_bytes=100, max_depth=5, what="doc")
    assert loads_bounded(b'["[[[[[["]', max_bytes=100, max_depth=1, what="doc") == [
        "[[[[[["
    ]
    with pytest.raises(JSONRefused, match=r"^doc is not valid JSON \(the key 'a'"):
        loads_bounded(b'{"a": 1, "a": 2}', max_bytes=100, max_depth=5, what="doc")
