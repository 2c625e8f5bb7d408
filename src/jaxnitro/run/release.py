"""`SplitRelease`: a handle's data sources, released once, and the refusal to read
one again.

Training releases them when it ends (the first Terminal phase, after the monitors
ran), `Nitro.release()` at any time; a source's `release()` closes what it holds
open, so a verb that would read a released split refuses before any stream opens,
naming what released it. A source without a `release()` holds nothing open and
stays readable.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..data.protocol import has_release, release_splits, unwrap_source
from ..errors import ConfigError

RELEASED_REFUSAL = (
    "{verb}: split `{name}` ({kind}) was released by {by}, which ran its source's "
    "release() and closed what it holds open, so this handle cannot read it again. "
    "Build a new Nitro with its own data and this handle's weights: "
    "Nitro(e, weights=nitro) (build_data runs again unless data= is passed)."
)


class SplitRelease:
    """The release of one handle's splits (`data`, the handle's own dict)."""

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data
        self._by: str | None = None

    @property
    def released_by(self) -> str | None:
        """What released the sources, once they are released."""
        return self._by

    def release(self, by: str) -> None:
        """Release every split's source, once; `by` names what released them."""
        if self._by is None:
            self._by = by
            release_splits(self._data)

    def refuse_released(self, verb: str, splits: Iterable[str]) -> None:
        """Refuse, before any stream opens, to read a split whose source was
        released."""
        if self._by is None:
            return
        for name in splits:
            if name in self._data and has_release(self._data[name]):
                kind = type(unwrap_source(self._data[name])).__name__
                raise ConfigError(
                    RELEASED_REFUSAL.format(
                        verb=verb, name=name, kind=kind, by=self._by
                    )
                )
