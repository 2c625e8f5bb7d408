"""How `Nitro(...)` reads its arguments before setup runs.

The preset form (`Nitro(E, "name", **kw)`: run keywords to the handle, field names to
the recipe), unknown keywords refused with the list of run keywords and the nearest
one, an experiment's field or method passed as a keyword refused showing where it
goes instead, the deprecated
`checkpoint=` spelling of `weights=`, and `run_ref`, which receives the built handle.
"""

from __future__ import annotations

import warnings
from typing import Any

from ..errors import ConfigError, user_stacklevel
from ..experiment.named_presets import from_preset, presets
from ..experiment.traits import field_names
from ..optim.setup import FIELD_ACCESSORS
from ..watch import did_you_mean
from .accessors import RUN_KEYWORDS

FIELD_NOT_KEYWORD = (
    "{name}={value!r} was passed to Nitro, but `{name}` is a field of {cls}, not a "
    "run keyword. Set it on the experiment, Nitro({cls}({name}={value!r})), or in "
    'the preset form, Nitro({cls}, "preset name", {name}={value!r}).'
)
METHOD_NOT_KEYWORD = (
    "{name}={value!r} was passed to Nitro, but `{name}` is a method of {cls}, not "
    "a run keyword: the experiment answers it. Override the method in the class, "
    "`def {name}(self, ...)`."
)
METHOD_OR_FIELD = (
    "{name}={value!r} was passed to Nitro, but `{name}` is a method of {cls}, not "
    "a run keyword: the experiment answers it. Set it on the experiment in either "
    "form: a method, `def {name}(self, group=None): return {value!r}`, or a field, "
    "`{name}: {kind} = {value!r}` in the class, then Nitro({cls}({name}={value!r}))."
)


def constructor_arguments(
    experiment: Any, preset: str | None, kwargs: dict[str, Any]
) -> tuple[Any, dict[str, Any]]:
    """The experiment instance and the run keywords `Nitro(experiment, preset,
    **kwargs)` stands for, checked: unknown keywords refused, `checkpoint=` read as
    `weights=` with a DeprecationWarning."""
    experiment, kwargs = _split_preset_form(experiment, preset, kwargs)
    unknown = sorted(set(kwargs) - set(RUN_KEYWORDS) - {"checkpoint"})
    for name in unknown:
        _refuse_experiment_name(type(experiment), name, kwargs[name], fields=True)
    if unknown:
        raise ConfigError(
            f"Unknown Nitro keyword{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(unknown)}. The run keywords are: "
            f"{', '.join(RUN_KEYWORDS)}.{_suggestions(unknown, RUN_KEYWORDS)}"
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
    for name in neither:
        _refuse_experiment_name(experiment, name, kwargs[name], fields=False)
    if neither:
        raise ConfigError(
            f"{', '.join(neither)}: neither a run keyword nor a field of "
            f"{experiment.__name__}. Run keywords: {', '.join(RUN_KEYWORDS)}. Fields: "
            f"{', '.join(sorted(fields))}."
            f"{_suggestions(neither, (*RUN_KEYWORDS, *sorted(fields)))}"
        )
    if preset not in presets(experiment):
        from_preset(experiment, preset)  # raises, listing the presets there are
    run_kw["preset"] = preset
    return from_preset(experiment, preset, **overrides), run_kw


def _refuse_experiment_name(cls: type, name: str, value: Any, *, fields: bool) -> None:
    """Refuse `Nitro(..., name=value)` where `name` is one of the experiment's own
    fields (when `fields`) or public methods, showing where the value goes."""
    if fields and name in field_names(cls):
        raise ConfigError(
            FIELD_NOT_KEYWORD.format(name=name, value=value, cls=cls.__name__)
        )
    if name.startswith("_") or not callable(getattr(cls, name, None)):
        return
    # An accessor a field of that name may stand in for shows both forms.
    template = METHOD_OR_FIELD if name in FIELD_ACCESSORS else METHOD_NOT_KEYWORD
    raise ConfigError(
        template.format(
            name=name, value=value, cls=cls.__name__, kind=type(value).__name__
        )
    )


def _suggestions(names: list[str], known: tuple[str, ...]) -> str:
    """` Did you mean ...?` for each misspelled name that has a near known one."""
    if len(names) == 1:
        return did_you_mean(names[0], known)
    return "".join(
        f" {name}:{hint}" for name in names if (hint := did_you_mean(name, known))
    )


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
