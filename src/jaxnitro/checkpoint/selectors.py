"""Selectors: which of a run's checkpoints a rule picks.

`Checkpointer(keep=...)` retains the union of what its selectors pick; a weights
source picks with one (`Best(1)` is "best", `Last(1)` is "latest", and any selector
inside `Average`). `Best`, `Last`, `Epochs` and `Every` are built in.

A custom selector is any object with

    select(entries, checkpointer) -> list[ManifestEntry]

returning the entries it keeps out of `entries` (the pool retention decides over:
this run's entries scored under the checkpointer's metric and mode, plus the new
candidate), and optionally

    admits(entries, candidate, checkpointer) -> bool

saying whether a write of `candidate` would be retained, decided before the record is
written; the default is "`candidate` is among what `select` picks from
`[*entries, candidate]`". An epoch that no selector admits is not written at all.
Two optional class attributes refine it: `ranks = True` for a selector that ranks by
score (it needs a metric), and `across_runs = True` for one that, under
`Checkpointer(scope="dir")`, decides over every run's entries instead of this run's.
Subclassing `Selector` gives the defaults.

Example:
    >>> from jaxnitro.checkpoint.checkpointer import Checkpointer
    >>> class Odd(Selector):
    ...     def select(self, entries, checkpointer):
    ...         return [e for e in entries if e.epoch % 2 == 1]
    >>> Checkpointer(keep=(Best(2), Odd()))
    Checkpointer(keep=(Best(k=2, among=None), Odd()), metric=None, mode=None)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from .manifest import ManifestEntry

if TYPE_CHECKING:
    from .checkpointer import Checkpointer


def is_scored_under(entry: ManifestEntry, metric: str | None, mode: str | None) -> bool:
    """Whether `entry` counts under `metric`/`mode`.

    An entry with no recorded metric (no score, or a manifest older than the field)
    counts as matching.
    """
    return entry.metric is None or (entry.metric == metric and entry.mode == mode)


class Selector:
    """A retention rule: which of the candidate entries to keep (see the module).

    Subclass it and define `select`; `admits` and the class attributes have
    defaults. The same selector serves retention (`Checkpointer(keep=...)`) and
    loading (`Average(selector)`, `Best(among=...)`).

    Attributes:
        ranks (bool): True for a selector that ranks by score, so needs a metric.
            Default False.
        across_runs (bool): True for one that, under `Checkpointer(scope="dir")`,
            decides over every run's entries instead of this run's. Default False.

    Examples:
        Selectors pick from manifest entries; here a run's three epochs:

        >>> from jaxnitro.checkpoint.checkpointer import Checkpointer
        >>> from jaxnitro.checkpoint.manifest import ManifestEntry
        >>> def entry(epoch, acc):
        ...     return ManifestEntry(
        ...         file=f"epoch-{epoch}", epoch=epoch, step=10 * epoch, score=acc,
        ...         stop_reason=None, run="r1", metric="acc", mode="max",
        ...         written=float(epoch), parent=None,
        ...     )
        >>> entries = [entry(1, 0.95), entry(2, 0.5), entry(3, 0.7)]
        >>> ckpt = Checkpointer(metric="acc", mode="max")
        >>> [e.epoch for e in Best(2).select(entries, ckpt)]
        [1, 3]
        >>> [e.epoch for e in Best(1, among=Last(2)).select(entries, ckpt)]
        [3]
        >>> [e.epoch for e in Last(2).select(entries, ckpt)]
        [2, 3]
        >>> [e.epoch for e in Every(2).select(entries, ckpt)]
        [2]
        >>> [e.epoch for e in Epochs([1, 3]).select(entries, ckpt)]
        [1, 3]
    """

    ranks = False
    across_runs = False

    def select(
        self, entries: Sequence[ManifestEntry], checkpointer: Checkpointer
    ) -> list[ManifestEntry]:
        """The entries this rule keeps out of `entries`.

        Args:
            entries: the pool. Under retention: this run's entries scored under
                the checkpointer's metric and mode or not scored at all, plus
                other runs' scored entries under scope "dir" for an `across_runs`
                selector, plus the new candidate. When loading: the entries of
                the run a source names.
            checkpointer: the checkpointer deciding, for its `metric`, `mode` and
                `scope`.

        Returns:
            list[ManifestEntry]: the entries kept, a sub-list of `entries`.

        Raises:
            NotImplementedError: a subclass that does not define it.
        """
        raise NotImplementedError(
            f"{type(self).__name__} must define select(entries, checkpointer)."
        )

    def admits(
        self,
        entries: Sequence[ManifestEntry],
        candidate: ManifestEntry,
        checkpointer: Checkpointer,
    ) -> bool:
        """Whether a write of `candidate` would be retained, decided before the
        record is written. An epoch no selector admits is not written at all.

        Args:
            entries: the pool, as `select` receives it, without the candidate.
            candidate: the entry the write would add (its score already known).
            checkpointer: the checkpointer deciding.

        Returns:
            bool: by default, whether `candidate` is among what `select` picks
            from `[*entries, candidate]`.
        """
        return candidate in self.select([*entries, candidate], checkpointer)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _check_count(owner: str, name: str, value: Any) -> None:
    """Refuse `owner(name)` other than an integer >= 1 (a bool is refused too)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(
            f"{owner}({name}) needs an integer {name} >= 1, got {value!r}."
        )


def is_selector(value: Any) -> bool:
    """Whether `value` implements the selector protocol (a callable `select`)."""
    return isinstance(value, Selector) or callable(getattr(value, "select", None))


def selector_admits(
    selector: Any,
    entries: Sequence[ManifestEntry],
    candidate: ManifestEntry,
    checkpointer: Checkpointer,
) -> bool:
    """`selector.admits(...)`, or the default for a selector that has none."""
    admits = getattr(selector, "admits", None)
    if callable(admits):
        return bool(admits(entries, candidate, checkpointer))
    return candidate in selector.select([*entries, candidate], checkpointer)


@dataclass(frozen=True, repr=True)
class Best(Selector):
    """The `k` best entries by the checkpointer's metric and mode.

    Only entries scored under that pair are ranked; ties go to the earlier epoch.
    `among`, a selector, ranks only what it picks: `Best(5, among=Last(20))` is the
    best 5 of the latest 20. `among` is for loading (as in `Average`); keep refuses it.
    It ranks by score (`ranks`), and under `Checkpointer(scope="dir")` it ranks
    every run's entries (`across_runs`). `Best(1)` is the source name "best".

    Args:
        k: how many to pick, an int >= 1 (default 1).
        among: a selector whose picks are ranked instead of the whole pool, or
            None.

    Raises:
        ConfigError: `k` is not an int >= 1 (a bool is refused), or `among` is not
            a selector.

    Examples:
        >>> Best(3)
        Best(k=3, among=None)
        >>> Best(0)
        Traceback (most recent call last):
        ...
        jaxnitro.errors.ConfigError: Best(k) needs an integer k >= 1, got 0.
    """

    k: int = 1
    among: Any = None

    ranks = True
    across_runs = True

    def __post_init__(self) -> None:
        _check_count("Best", "k", self.k)
        if self.among is not None and not is_selector(self.among):
            raise ConfigError(
                f"Best(among=...) takes a selector such as Last(20), got "
                f"{self.among!r}."
            )

    def select(
        self, entries: Sequence[ManifestEntry], checkpointer: Checkpointer
    ) -> list[ManifestEntry]:
        pool = (
            list(entries)
            if self.among is None
            else self.among.select(entries, checkpointer)
        )
        metric, mode = checkpointer.metric, checkpointer.mode
        scored = [
            e for e in pool if e.score is not None and is_scored_under(e, metric, mode)
        ]
        sign = -1.0 if mode == "max" else 1.0
        scored.sort(key=lambda e: (sign * float(e.score), e.epoch, e.written))  # type: ignore[arg-type]
        return scored[: self.k]


@dataclass(frozen=True)
class Last(Selector):
    """This run's latest `n` entries.

    Latest by epoch under scope "run", by write time under scope "dir". `Last(1)`
    is the source name "latest". A `Last` in `keep` makes every epoch be written.

    Args:
        n: how many to pick, an int >= 1 (default 1).

    Raises:
        ConfigError: `n` is not an int >= 1 (a bool is refused).

    Examples:
        >>> Last(10)
        Last(n=10)
    """

    n: int = 1

    def __post_init__(self) -> None:
        _check_count("Last", "n", self.n)

    def select(
        self, entries: Sequence[ManifestEntry], checkpointer: Checkpointer
    ) -> list[ManifestEntry]:
        if getattr(checkpointer, "scope", "run") == "dir":
            order = sorted(entries, key=lambda e: (e.written, e.epoch))
        else:
            order = sorted(entries, key=lambda e: (e.epoch, e.written))
        return order[-self.n :]


@dataclass(frozen=True, init=False)
class Epochs(Selector):
    """This run's entries whose epoch is in `epochs`, a range or a collection.

    Args:
        epochs: a `range` (kept as it is) or an iterable of epoch numbers, each an
            int >= 1 (stored as a frozenset).

    Raises:
        ConfigError: `epochs` is not iterable; a number in a collection is not an
            int >= 1; there is no epoch at all (an empty range included).

    Examples:
        >>> Epochs(range(10, 101, 10))
        Epochs(epochs=range(10, 101, 10))
        >>> Epochs([1, 2, 5])
        Epochs(epochs=frozenset({1, 2, 5}))
    """

    epochs: range | frozenset[int]

    def __init__(self, epochs: range | Iterable[int]) -> None:
        if isinstance(epochs, range):
            value: range | frozenset[int] = epochs
            if len(value) and min(value) < 1:  # a range is never in the set check
                raise ConfigError(
                    f"Epochs(epochs) takes epoch numbers >= 1; {epochs!r} holds "
                    f"{min(value)}. Keep the range at 1 or above, e.g. "
                    f"range(1, {max(value) + 1})."
                )
        else:
            try:
                value = frozenset(epochs)
            except TypeError:
                raise ConfigError(
                    f"Epochs(epochs) takes a range or a collection of epoch numbers, "
                    f"such as range(10, 101, 10); got {epochs!r}."
                ) from None
            bad = [
                e
                for e in value
                if not isinstance(e, int) or isinstance(e, bool) or e < 1
            ]
            if bad:
                raise ConfigError(
                    f"Epochs(epochs) takes epoch numbers >= 1; got {sorted(bad)!r}."
                )
        if len(value) == 0:
            raise ConfigError("Epochs(epochs) needs at least one epoch; got none.")
        object.__setattr__(self, "epochs", value)

    def select(
        self, entries: Sequence[ManifestEntry], checkpointer: Checkpointer
    ) -> list[ManifestEntry]:
        return [e for e in entries if e.epoch in self.epochs]


@dataclass(frozen=True)
class Every(Selector):
    """This run's entries whose epoch is a multiple of `n`.

    Args:
        n: the period, an int >= 1.

    Raises:
        ConfigError: `n` is not an int >= 1 (a bool is refused).

    Examples:
        >>> from jaxnitro.checkpoint.checkpointer import Checkpointer
        >>> Checkpointer(keep=(Best(3), Every(10)))  # the best 3 and every 10th
        Checkpointer(keep=(Best(k=3, among=None), Every(n=10)), metric=None, mode=None)
    """

    n: int

    def __post_init__(self) -> None:
        _check_count("Every", "n", self.n)

    def select(
        self, entries: Sequence[ManifestEntry], checkpointer: Checkpointer
    ) -> list[ManifestEntry]:
        return [e for e in entries if e.epoch % self.n == 0]
