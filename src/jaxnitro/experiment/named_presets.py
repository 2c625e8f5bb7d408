"""Named configurations: `presets(E)` and `from_preset(E, name, **overrides)`.

A preset is a partial set of field values, declared on the experiment class:

    class MyExp(Experiment):
        width: GraphConst[int] = 128
        smoothing: Device[float] = 0.05

        @classmethod
        def presets(cls):
            return {"reference_v1": {"width": 128, "smoothing": 0.0},
                    "current": {"width": 256}}

    e = from_preset(MyExp, "current", max_epochs=40)   # overrides win over the preset
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from .view import check_field_names


def presets(cls: type) -> dict[str, dict[str, Any]]:
    """The table of named configurations of an experiment class (empty by default)."""
    table = getattr(cls, "presets", None)
    if table is None:
        return {}
    table = table() if callable(table) else table
    return {str(name): dict(values) for name, values in dict(table).items()}


def from_preset(cls: type, name: str, **overrides: Any) -> Any:
    """Build an experiment from `presets(cls)[name]`, with `overrides` winning.

    Every key of the preset and of the overrides is validated against the fields, since
    an unknown key would otherwise be ignored. The name is not recorded; use
    `Nitro(cls, name, ...)` for a run that names its recipe.
    """
    table = presets(cls)
    if name not in table:
        known = ", ".join(f'"{n}"' for n in table) or "none"
        raise ConfigError(
            f'{cls.__name__} has no preset "{name}". Its presets are: {known}. '
            f"Declare presets with a `presets` classmethod returning a dict."
        )
    check_field_names(
        cls,
        table[name],
        f'Preset "{name}" sets',
        "Fix the preset's keys in the `presets` table.",
    )
    check_field_names(
        cls, overrides, "The override", "Pass field names of the experiment."
    )
    return cls(**{**table[name], **overrides})
