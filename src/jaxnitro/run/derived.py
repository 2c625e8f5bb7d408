"""The values `derive` produced: converted like constructed ones, or read back.

A weights= load does not run `derive` when the record lists what it produced: the
values come back from the record (`derived_from_record`), Device arrays, GraphConst
values and Host values each from where the writer put them.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from ..checkpoint.derived import HOST_PREFIX, graphconst_from_json
from ..checkpoint.record import CheckpointRecord
from ..errors import ConfigError, NitroWarning, user_stacklevel
from ..experiment.traits import (
    config_metadata,
    device_fields,
    graphconst_fields,
    host_fields,
)
from ..experiment.values import coerce_graphconst

DERIVED_NOT_RECORDED = """\
weights={path}: the record does not hold the values derive produced for {fields} \
(a record keeps Device arrays, GraphConst values and scalar Host values), and derive \
does not run for a weights= load, so this experiment's values are kept. Fix: set them \
on the experiment, computed from the data you have, or make a numeric one Device so \
the record stores it."""


def convert_derived(
    cls: type, derived: Mapping[str, Any], *, from_record: bool
) -> dict[str, Any]:
    """`derived` with its GraphConst values converted to their declared types.

    derive's values bypass the keyword constructor, which converts GraphConst values
    (a list to a tuple, 3.0 to a declared int) and refuses a lossy conversion; the
    same happens here, so a derived value keys and traces like a constructed one.
    """
    meta = config_metadata(cls)
    converted = dict(derived)
    for name in graphconst_fields(cls):
        if name not in derived:
            continue
        declared = meta[name].type if name in meta else None
        try:
            converted[name] = coerce_graphconst(name, declared, derived[name])
        except ConfigError as error:
            source = "The record's derived value" if from_record else "derive's value"
            raise ConfigError(f"{source} for `{name}` is refused: {error}") from None
    return converted


def derived_from_record(cls: type, record: CheckpointRecord) -> dict[str, Any]:
    """The values derive produced for the run that wrote `record`, read back.

    A Device value is a stored array, a GraphConst value is in the record's
    GraphConst table, a scalar Host value in its logged config, and a numeric
    Host array or a JSON Host value where `derived_host_record` put it. Other
    Host values are in no record: such a field keeps this experiment's value,
    with a warning, since derive does not run to recompute it.
    """
    host = {
        **record.header.config,
        **record.header.derived_host,
        **record.field_arrays(HOST_PREFIX),
    }
    graphconst = record.header.derived_graphconst
    if graphconst is None:  # a record from before derived values were exact
        graphconst = record.header.graphconst
    graphconst = {k: graphconst_from_json(v) for k, v in graphconst.items()}
    tables = {
        **dict.fromkeys(device_fields(cls), record.device_values()),
        **dict.fromkeys(graphconst_fields(cls), graphconst),
        **dict.fromkeys(host_fields(cls), host),
    }
    derived = {}
    missing = []
    for name in record.header.derived or ():
        table = tables.get(name)
        if table is not None and name in table:
            derived[name] = table[name]
        else:
            missing.append(name)
    if missing:
        warnings.warn(
            DERIVED_NOT_RECORDED.format(
                path=record.path, fields=", ".join(f"`{n}`" for n in missing)
            ),
            NitroWarning,
            stacklevel=user_stacklevel(),
        )
    return derived
