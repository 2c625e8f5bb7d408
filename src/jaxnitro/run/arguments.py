"""How `Nitro(...)` reads its arguments before setup runs.

The preset form (`Nitro(E, "name", **kw)`: run keywords to the handle, field names to
the recipe), unknown keywords refused with the list of run keywords, the deprecated
`checkpoint=` spelling of `weights=`, and `run_ref`, which receives the built handle.
"""

from __future__ import annotations

import warnings
from typing import Any

from ..errors import ConfigError, user_stacklevel
from ..experiment.presets import from_preset, presets
from ..experiment.traits import field_names
from .accessors import RUN_KEYWORDS


def constructor_arguments(
    experiment: Any, preset: str | None, kwargs: dict[str, Any]
) -> tuple[Any, dict[str, Any]]:
    """The experiment instance and the run keywords `Nitro(experiment, preset,
    **kwargs)` stands for, checked: unknown keywords refused, `checkpoint=` read as
    `weights=` with a DeprecationWarning."""
    experiment, kwargs = _split_preset_form(experiment, preset, kwargs)
    unknown = sorted(set(kwargs) - set(RUN_KEYWORDS) - {"checkpoint"})
    if unknown:
        raise ConfigError(
            f"Unknown Nitro keyword{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(unknown)}. The run keywords are: "
            f"{', '.join(RUN_KEYWORDS)}."
        )
    if "checkpoint" in kwargs and "weights" in kwargs:
        raise ConfigError(
            "checkpoint= and weights= were both passed; checkpoint= is the "
            "deprecated spelling of weights=, so one would silently win. Pass "
            "weights= alone."
        )
    if "checkpoint" in kwargs:
        warnings.warn(
            "checkpoint= is the deprecated spelling of weights=; use weights=.",
            DeprecationWarning,
            stacklevel=user_stacklevel(),
        )
        kwargs["weights"] = kwargs.pop("checkpoint")
    return experiment, kwargs


def _split_preset_form(
    experiment: Any, preset: str | None, kwargs: dict[str, Any]
) -> tuple[Any, dict[str, Any]]:
    """`Nitro(E, "name", **kw)`: run keywords to the handle, fields to the recipe."""
    if not isinstance(experiment, type):
        if preset is not None:
            raise ConfigError(
                "Nitro(e, name): a preset name goes with the experiment class, "
                "Nitro(MyExp, name, ...), not with an instance."
            )
        named = kwargs.get("preset")
        if named is not None and named not in presets(type(experiment)):
            raise ConfigError(
                f"preset={named!r}: {type(experiment).__name__} declares no such "
                f"preset, and the name is logged and stored in checkpoints as the "
                f"recipe this run used. Its presets: "
                f"{', '.join(presets(type(experiment))) or 'none'}."
            )
        return experiment, kwargs
    if preset is None:
        raise ConfigError(
            f"Nitro({experiment.__name__}) needs an instance, "
            f"Nitro({experiment.__name__}()), or a preset name: "
            f'Nitro({experiment.__name__}, "name", ...).'
        )
    if "data" in kwargs:
        raise ConfigError(
            "data= is refused in the preset form, since the collection would come "
            "from another instance than the one built here. Write "
            f"Nitro(from_preset({experiment.__name__}, {preset!r}), preset={preset!r}, "
            f"data=...)."
        )
    fields = set(field_names(experiment))
    # `checkpoint` is the deprecated spelling of `weights`: a run keyword too.
    run_kw = {k: v for k, v in kwargs.items() if k in RUN_KEYWORDS or k == "checkpoint"}
    overrides = {
        k: v for k, v in kwargs.items() if k not in RUN_KEYWORDS and k in fields
    }
    neither = sorted(set(kwargs) - set(run_kw) - set(overrides))
    if neither:
        raise ConfigError(
            f"{', '.join(neither)}: neither a run keyword nor a field of "
            f"{experiment.__name__}. Run keywords: {', '.join(RUN_KEYWORDS)}. Fields: "
            f"{', '.join(sorted(fields))}."
        )
    if preset not in presets(experiment):
        from_preset(experiment, preset)  # raises, listing the presets there are
    run_kw["preset"] = preset
    return from_preset(experiment, preset, **overrides), run_kw


def fill_ref(ref: Any, nitro: Any) -> None:
    """Hand the built handle to `run_ref`: a list gets it appended, a callable is
    called with it."""
    if hasattr(ref, "append"):
        ref.append(nitro)
    elif callable(ref):
        ref(nitro)
    else:
        raise ConfigError(
            "run_ref must be a list (the handle is appended) or a callable (called "
            f"with the handle); got {type(ref).__name__}."
        )
