"""Validation metrics: `(value, mode)` pairs combined across the batches of a split.

`metrics` returns, per eval batch, a dict whose leaves are pairs:

    {"acc": (n_correct, n_images),          # a count: summed, then divided at the end
     "confusion": (matrix, "sum"),          # summed, never divided (None: the same)
     "scores": (per_sample, "concat")}      # concatenated along the batch axis

A dict, a namedtuple or a tuple of pairs is a group: its own leaves carry their modes,

    {"g": {"hits": (h, n), "n": (n, "sum")}}          # a dict group
    {"g": Counts(hits=(h, n), n=(n, "sum"))}          # a namedtuple group
    {"g": ((h, n), (n, "sum"))}                       # a tuple group: g/0, g/1

or a mode on a dict or namedtuple group, `(Counts(hits=h, n=n), "sum")`, covers every
leaf below it. A plain tuple under a mode is one value (NumPy stacks it): Python cannot
tell `(h, n)` there from a (value, count) pair. The combined result has the same shape
(dicts, namedtuples of the same class, tuples) with the modes removed, and goes through
`finalize_metrics(acc, split)`. Sums keep an integer dtype (as int64): a confusion
matrix or a count stays integral; a count mode divides, into float64.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

from .errors import HookError

COUNT = "count"
SUM = "sum"
CONCAT = "concat"


def _is_mode(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, str):
        return value in (SUM, CONCAT)
    if isinstance(value, bool):
        return False
    if isinstance(value, numbers.Number | np.generic):
        return True
    return hasattr(value, "shape") and np.ndim(value) == 0


def _is_namedtuple(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(type(value), "_fields")


def _is_pair(value: Any) -> bool:
    return (
        isinstance(value, tuple)
        and not _is_namedtuple(value)
        and len(value) == 2
        and _is_mode(value[1])
    )


def _is_tuple_group(value: Any) -> bool:
    """A plain tuple of pairs or groups, which is not itself a pair."""
    return (
        type(value) is tuple
        and len(value) > 0
        and not _is_pair(value)
        and all(_is_pair(item) or _group(item, None) is not None for item in value)
    )


def _group(tree: Any, mode: Any) -> tuple[Any, list[tuple[str, Any]]] | None:
    """A group's container (dict, its namedtuple class, or tuple) and its keyed
    items, or None for what is no group. Under a mode (`mode` not None) a plain
    tuple is a value, never a group."""
    if isinstance(tree, Mapping):
        return dict, [(str(key), value) for key, value in tree.items()]
    if _is_namedtuple(tree):
        return type(tree), list(zip(type(tree)._fields, tree, strict=True))
    if mode is None and _is_tuple_group(tree):
        return tuple, [(str(i), value) for i, value in enumerate(tree)]
    return None


@dataclass(frozen=True)
class MetricLeaf:
    """One metric of one batch, flattened: `value` combined at `path` as `mode` says.

    A pytree whose `path` and `mode` are static: a device program returns these, so
    only arrays leave the trace, and the modes come back in the output's treedef
    (from a cached executable too, which no trace-time side channel would survive).
    """

    path: tuple[str, ...]
    mode: str  # COUNT, SUM or CONCAT
    value: Any
    count: Any = None  # the divisor of a COUNT metric
    groups: tuple[Any, ...] = ()
    """The container of each group along `path` (dict, a namedtuple class, tuple):
    one per key but the last, so the combined result takes the batches' shape."""


jax.tree_util.register_dataclass(
    MetricLeaf,
    data_fields=["value", "count"],
    meta_fields=["path", "mode", "groups"],
)


@dataclass
class _Leaf:
    mode: str  # COUNT, SUM or CONCAT
    total: Any = None
    count: float = 0.0
    parts: list[Any] = field(default_factory=list)
    groups: tuple[Any, ...] = ()


def _flatten(
    tree: Any,
    path: tuple[str, ...],
    groups: tuple[Any, ...],
    mode: Any,
    out: list[MetricLeaf],
) -> None:
    """Flatten one batch's metric tree into `out`, validating the pairs."""
    group = _group(tree, mode)
    if group is not None:
        container, items = group
        for key, value in items:
            _flatten(value, (*path, key), (*groups, container), mode, out)
        return
    if mode is not None:  # inside a group whose pair set one mode for every leaf
        if _is_pair(tree):
            raise HookError(_COVERED_TWICE.format(name="/".join(path)))
        out.append(_leaf(path, groups, tree, mode))
        return
    if _is_pair(tree):
        value, leaf_mode = tree
        if _is_pair(value):  # ((v, mode), mode): which mode combines v?
            raise HookError(_COVERED_TWICE.format(name="/".join(path)))
        _flatten(value, path, groups, SUM if leaf_mode is None else leaf_mode, out)
        return
    name = "/".join(path) or "<metrics>"
    raise HookError(_NOT_A_PAIR.format(name=name, kind=type(tree).__name__))


_NOT_A_PAIR = (
    "metric `{name}` must be a (value, mode) pair, where mode is a count to divide "
    'by, None or "sum" to sum without dividing, or "concat", or a group of them: a '
    "dict, a namedtuple or a tuple of pairs; got {kind}. Example: "
    "{{'acc': (n_correct, n_samples)}}, or {{'g': ((hits, n), (n, 'sum'))}}."
)

_COVERED_TWICE = (
    "metric `{name}` is a (value, mode) pair inside a pair or a group that already "
    "has a mode: each leaf must be covered by exactly one mode. Drop the "
    "leaf's mode, {{'g': ({{'a': value}}, 'sum')}}, or the group's, "
    "{{'g': {{'a': (value, 'sum')}}}}. A mode on a group takes a dict or a "
    "namedtuple; a plain tuple under a mode is one value, so pass a tuple meant as "
    "a value as an array, and a group of values as a dict or a namedtuple."
)


def _leaf(
    path: tuple[str, ...], groups: tuple[Any, ...], value: Any, mode: Any
) -> MetricLeaf:
    if isinstance(mode, str):
        return MetricLeaf(path, mode, value, groups=groups)
    return MetricLeaf(path, COUNT, value, mode, groups=groups)


def flatten_metrics(tree: Any) -> list[MetricLeaf]:
    """One batch's metrics as a list of leaves, validating the pairs."""
    if not isinstance(tree, Mapping):
        raise HookError(
            f"`metrics` must return a dict of (value, mode) pairs; it returned "
            f"{type(tree).__name__}."
        )
    out: list[MetricLeaf] = []
    for key, value in tree.items():
        _flatten(value, (str(key),), (), None, out)
    return out


class MetricAccumulator:
    """Combines the metric pairs of a split's batches as their modes say."""

    def __init__(self) -> None:
        self._leaves: dict[tuple[str, ...], _Leaf] = {}
        self.concatenated: dict[int, str] = {}
        """`id` of each concat leaf's array in the last `result()`, to its name."""

    def add(self, tree: Any, *, n_real: int | None = None) -> None:
        """Add one batch's metrics (host or device values); see `add_leaves`."""
        self.add_leaves(flatten_metrics(tree), n_real=n_real)

    def add_leaves(
        self, leaves: list[MetricLeaf], *, n_real: int | None = None
    ) -> None:
        """Add one batch's flattened metrics; `n_real`: its real sample count, which
        each concat leaf must match."""
        for leaf in leaves:
            mode = leaf.count if leaf.mode == COUNT else leaf.mode
            self.add_leaf(
                leaf.path, leaf.value, mode, n_real=n_real, groups=leaf.groups
            )

    def add_leaf(
        self,
        path: tuple[str, ...],
        value: Any,
        mode: Any,
        *,
        n_real: int | None = None,
        groups: tuple[Any, ...] = (),
    ) -> None:
        """Add one leaf; `groups`: the container of each group along `path`."""
        kind = mode if isinstance(mode, str) else COUNT
        name = "/".join(path)
        leaf = self._leaves.setdefault(path, _Leaf(kind, groups=groups))
        if leaf.mode != kind:
            raise HookError(
                f"metric `{name}` changed its mode between batches "
                f"({leaf.mode} then {kind}); a metric must combine one way."
            )
        host = np.asarray(value)
        if kind == CONCAT:
            if host.ndim == 0:
                raise HookError(
                    f'metric `{name}` is "concat" but a batch returned a '
                    f"scalar; a concat metric needs one entry per sample on axis 0."
                )
            if n_real is not None and len(host) != n_real:
                raise HookError(
                    f'metric `{name}` is "concat" but returned {len(host)} entries '
                    f"for a batch of {n_real} samples; a concat metric needs one "
                    f"entry per sample on axis 0 (reduce it first, or use a count "
                    f'or "sum" mode).'
                )
            leaf.parts.append(host)
            return
        widened = (
            host.astype(_WIDE[host.dtype.kind]) if host.dtype.kind in _WIDE else host
        )
        leaf.total = widened if leaf.total is None else leaf.total + widened
        if kind == COUNT:
            leaf.count += float(np.asarray(mode))

    def result(self) -> dict[str, Any]:
        """The combined metrics, shaped like the batches' metrics, modes removed."""
        combined: dict[str, Any] = {}
        containers: dict[tuple[str, ...], Any] = {}
        self.concatenated = {}
        for path, leaf in self._leaves.items():
            for depth, container in enumerate(leaf.groups):
                containers[path[: depth + 1]] = container
            if leaf.mode == CONCAT:
                value = np.concatenate(leaf.parts, axis=0)
                self.concatenated[id(value)] = "/".join(path)
            elif leaf.mode == COUNT:
                value = leaf.total / leaf.count if leaf.count else np.nan * leaf.total
            else:
                value = leaf.total
            node = combined
            for key in path[:-1]:
                node = node.setdefault(key, {})
            node[path[-1]] = plain(value)
        return _reshape(combined, (), containers)


_WIDE = {"b": np.int64, "i": np.int64, "u": np.uint64, "f": np.float64}
"""What a summed leaf accumulates in: integers stay integral (a count, a confusion
matrix), every kind widened so that many batches neither overflow nor lose digits."""


def _reshape(
    node: dict[str, Any],
    prefix: tuple[str, ...],
    containers: dict[tuple[str, ...], Any],
) -> dict[str, Any]:
    """Nested dicts back in the containers the batches' groups came in."""
    out: dict[str, Any] = {}
    for key, child in node.items():
        path = (*prefix, key)
        container = containers.get(path)
        if container is None:  # a leaf
            out[key] = child
            continue
        items = _reshape(child, path, containers)
        if container is tuple:
            out[key] = tuple(items[k] for k in sorted(items, key=int))
        elif container is dict:
            out[key] = items
        else:  # a namedtuple class
            out[key] = container(*(items.get(f) for f in container._fields))
    return out


def plain(value: Any) -> Any:
    """A 0-d array becomes a Python number; other arrays stay NumPy arrays."""
    if isinstance(value, np.ndarray | np.generic) and np.ndim(value) == 0:
        return np.asarray(value).item()
    return value


def refuse_unreduced(result: Mapping[str, Any], concatenated: dict[int, str]) -> None:
    """Refuse a concat leaf that `finalize_metrics` handed back as it came: a
    per-sample array is an input to a metric (an AUC, a ranking), not one that a
    log line or the history can hold."""
    for value in _values(result):
        name = concatenated.get(id(value))
        if name is not None:
            raise HookError(
                f'metric `{name}` is "concat", and finalize_metrics returned its '
                f"{len(value)} per-sample entries unreduced. Reduce it there (e.g. "
                f"an AUC over the scores) and return the number; keep the array on "
                f"the experiment if a monitor needs it."
            )


def _values(tree: Any) -> Any:
    if isinstance(tree, Mapping):
        for value in tree.values():
            yield from _values(value)
    elif isinstance(tree, tuple | list):
        for value in tree:
            yield from _values(value)
    else:
        yield tree
