"""The checks behind `Nitro.set_device` and `Nitro.device_value`: which names are
Device fields a live handle may write or read, and each new value converted to its
field's dtype and placed with the current value's sharding."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from ..errors import ConfigError
from ..experiment.markers import Kind
from ..experiment.traits import (
    device_fields,
    field_kind_of,
    field_names,
    graphconst_fields,
)
from ..experiment.values import to_host_array
from ..loop.prepared import Prepared


def device_updates(
    prepared: Prepared,
    experiment: Any,
    field_value: tuple[Any, ...],
    values: dict[str, Any],
) -> dict[str, Any]:
    """The device arrays `set_device(*field_value, **values)` writes, every value
    checked before any is written."""
    if field_value:
        values = _positional_field(field_value, values)
    updates = {}
    for name, value in values.items():
        _check_writable(prepared, name)
        current = getattr(experiment, name)
        try:
            host = to_host_array(name, np.dtype(current.dtype), value)
        except ConfigError as error:
            raise ConfigError(
                f"set_device: {error} The field's dtype is fixed by the compiled "
                f"programs: build a new Nitro for another dtype."
            ) from None
        if host.shape != current.shape:
            raise ConfigError(
                f"set_device: `{name}` has shape {tuple(current.shape)}; the new "
                f"value has shape {host.shape}. Shapes are fixed by the compiled "
                f"programs: build a new Nitro for another shape."
            )
        updates[name] = jax.device_put(host, current.sharding)
    return updates


def _check_writable(prepared: Prepared, name: str) -> None:
    """Refuse a name that is no field, a GraphConst or Host field, or scheduled."""
    cls = prepared.cls
    if name not in field_names(cls):
        raise ConfigError(
            f"set_device: {cls.__name__} has no field `{name}`. Its Device "
            f"fields are: {', '.join(device_fields(cls)) or 'none'}."
        )
    if name not in device_fields(cls):
        if name in graphconst_fields(cls):
            raise ConfigError(
                f"set_device: `{name}` is GraphConst: it bakes into the "
                f"compiled graph, so a new value is a different program. Build "
                f"a new Nitro with the new value (only what it changes "
                f"recompiles)."
            )
        raise ConfigError(
            f"set_device: `{name}` is a Host field: no compiled program reads "
            f"it, so writing it on a live handle would change nothing. Build a "
            f"new Nitro with the new value, or mark the field Device."
        )
    if any(target.name == name for target, _ in prepared.device_schedules):
        raise ConfigError(
            f"set_device: `{name}` is scheduled: the schedule writes it every "
            f"step and would overwrite this value. Build a new Nitro without "
            f"`{name}` in its schedules to set it by hand."
        )


def check_device_field(cls: type, name: str) -> None:
    """Refuse `device_value(name)` for a name that is no Device field."""
    if name in device_fields(cls):
        return
    kind = "no"
    if name in field_names(cls):
        marker = field_kind_of(cls, name)
        kind = "a GraphConst" if marker is Kind.GRAPHCONST else "a Host"
    raise ConfigError(
        f"device_value: `{name}` is {kind} field of "
        f"{cls.__name__}, not a Device field; read it as "
        f"nitro.experiment.{name}. Device fields: "
        f"{', '.join(device_fields(cls)) or 'none'}."
    )


def _positional_field(
    field_value: tuple[Any, ...], values: dict[str, Any]
) -> dict[str, Any]:
    """`set_device(name, value)` as the keyword form's dict."""
    if len(field_value) != 2 or not isinstance(field_value[0], str):
        raise ConfigError(
            f"set_device takes one field positionally as (name, value), such as "
            f'set_device("temperature", 2.0), or keywords (temperature=2.0); got '
            f"{len(field_value)} positional argument(s): {field_value!r}."
        )
    name, value = field_value
    if name in values:
        raise ConfigError(
            f"set_device: `{name}` is given both positionally and as a keyword; "
            f"give it once."
        )
    return {name: value, **values}
