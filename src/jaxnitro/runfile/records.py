"""Reading a loader's records: JSON lines (plain or gzip) into one array per field.

The files are read once, when the loader is built, so a batch is an index into
arrays. A record whose field is missing, of the wrong type or of the wrong shape
is remembered by its row with an E-LOAD diagnostic naming the file, the line and
the field: the first record's is raised at once (before any step), a later one's
when a batch first holds that record.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .source import RunfileError, fail
from .stdlib_data import FieldSpec, LoaderSpec


@dataclass(frozen=True)
class Records:
    """Every record of a loader: `arrays[field]` is [records, *shape] of its dtype.

    `bad` maps a row to the diagnostic of its first bad field (the row's arrays
    hold zeros); `where` names each row's `file:line`.
    """

    arrays: dict[str, np.ndarray]
    bad: dict[int, RunfileError]
    where: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.where)

    def check_rows(self, rows: np.ndarray) -> None:
        """Raise the diagnostic of the first bad row among `rows`, if any."""
        if self.bad:
            for row in rows.tolist():
                if row in self.bad:
                    raise self.bad[row]


def _lines(path: str, encoding: str) -> list[bytes]:
    if not os.path.isfile(path):
        raise fail(
            "E-LOAD-008",
            f"no data file {path!r}",
            None,
            "paths in (files [...]) are relative to the run file; "
            "examples/runfiles/make_data.py writes the examples' data",
        )
    try:
        if encoding == "jsonl.gz":
            with gzip.open(path, "rb") as handle:
                raw = handle.read()
        else:
            with open(path, "rb") as handle:
                raw = handle.read()
    except (OSError, EOFError) as error:
        raise fail(
            "E-LOAD-008",
            f"cannot read {path!r} as {encoding}: {error}",
            None,
            'check the file and its :encoding ("jsonl" or "jsonl.gz")',
        ) from None
    return raw.splitlines()


def _value(
    record: object, spec: FieldSpec, where: str
) -> tuple[np.ndarray | None, RunfileError | None]:
    """One field of one record as an array, or the diagnostic saying why not."""
    if not isinstance(record, dict) or spec.source not in record:
        keys = " ".join(sorted(record)) if isinstance(record, dict) else "none"
        return None, fail(
            "E-LOAD-009",
            f"{where}: field :{spec.name} reads key {spec.source!r}, which the "
            f"record does not have (its keys: {keys})",
            None,
            "fix the record, or the field's :from",
        )
    dtype = np.dtype(spec.dtype)
    try:
        value = np.asarray(record[spec.source])
    except ValueError:  # ragged nested lists
        value = np.asarray(None)
    integral = dtype.kind in "iub"
    fits = (
        value.dtype.kind in "iub"
        if integral
        else value.dtype.kind in "iubf" and value.dtype != object
    )
    if not fits:
        return None, fail(
            "E-LOAD-010",
            f"{where}: field :{spec.name} (key {spec.source!r}) holds "
            f"{value.dtype.name if value.dtype != object else 'mixed or ragged'} "
            f"values, not :{_short(spec.dtype)}",
            None,
            f"write {'integers' if integral else 'numbers'} in the record",
        )
    if value.shape != spec.shape:
        return None, fail(
            "E-LOAD-011",
            f"{where}: field :{spec.name} (key {spec.source!r}) has shape "
            f"{list(value.shape)}, but the loader declares {list(spec.shape)}",
            None,
            "fix the record, or the field's :shape",
        )
    return value.astype(dtype), None


def _short(dtype: str) -> str:
    from .stdlib_data import DTYPES

    return next((k for k, v in DTYPES.items() if v == dtype), dtype)


def read_records(spec: LoaderSpec, base: str) -> Records:
    """Read every record of `spec`'s files (paths relative to the folder `base`).

    Raises:
        RunfileError: E-LOAD-008 for a missing or unreadable file or no records,
            E-LOAD-009/010/011 when the first record is bad (later bad records are
            raised by `Records.check_rows`).
    """
    columns: dict[str, list[np.ndarray]] = {f.name: [] for f in spec.fields}
    zeros = {f.name: np.zeros(f.shape, f.dtype) for f in spec.fields}
    bad: dict[int, RunfileError] = {}
    where: list[str] = []
    for files in spec.sources:
        for relative in files.paths:
            path = os.path.join(base, relative)
            for number, line in enumerate(_lines(path, files.encoding), 1):
                if not line.strip():
                    continue
                here = f"{relative}:{number}"
                row = len(where)
                where.append(here)
                try:
                    record = json.loads(line)
                except ValueError as reason:
                    record, bad[row] = (
                        None,
                        fail("E-LOAD-010", f"{here}: not a JSON record ({reason})"),
                    )
                for field in spec.fields:
                    value, refused = (
                        (None, None) if row in bad else _value(record, field, here)
                    )
                    if refused is not None:
                        bad[row] = refused
                    columns[field.name].append(
                        value if value is not None else zeros[field.name]
                    )
    if not where:
        raise fail(
            "E-LOAD-008",
            "the loader's files hold no records: "
            + ", ".join(p for s in spec.sources for p in s.paths),
            None,
            "write one JSON record per line",
        )
    if 0 in bad:
        raise bad[0]
    arrays = {name: np.stack(values) for name, values in columns.items()}
    return Records(arrays, bad, tuple(where))


def field_sizes(spec: LoaderSpec) -> dict[str, int]:
    """Elements per record of each field (the `tokens` counter reads it)."""
    return {f.name: int(np.prod(f.shape)) for f in spec.fields}


def paths_of(spec: LoaderSpec) -> Sequence[str]:
    """Every path the loader declares, as written."""
    return [p for s in spec.sources for p in s.paths]
