"""`Checkpointer`, its selectors `Best` and `Last`, and the run directory's manifest.

After each epoch the checkpointer writes a record if some selector in `keep` would
retain it, then keeps the union of what the selectors pick and deletes the rest. The
manifest, `manifest.json`, lists every retained file with its epoch, score, stop_reason
and the run, metric and mode that wrote it, so lookups and resume never open a record.

Order of a write: the record goes to a temporary file renamed into place, then the
manifest is replaced atomically, and only then are rotated files deleted, so a crash at
any instant leaves a readable directory.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import CheckpointError, ConfigError, NotYetSupportedError
from .record import atomic_write, save_record

MANIFEST = "manifest.json"
RECORD_SUFFIX = ".safetensors"


@dataclass(frozen=True)
class ManifestEntry:
    """One retained checkpoint, as the manifest lists it.

    Attributes:
        file: the record's basename in the run directory.
        epoch: the epoch it was written at; step the optimizer step.
        score: the retention metric's value, or None for a run with no val split.
        stop_reason: how the run ended, when this was its last record; else None.
        run: the id of the run that wrote it.
        metric, mode: what `score` measures and which way is better.
        written: the wall-clock `time.time()` of the write.
        parent: for a run branched from an earlier record, that record's path.
    """

    file: str
    epoch: int
    step: int
    score: float | None
    stop_reason: str | None
    run: str | None
    metric: str | None
    mode: str | None
    written: float
    parent: str | None


def read_manifest(directory: str) -> list[ManifestEntry]:
    """The checkpoints a run directory holds, without opening one (empty if none)."""
    path = os.path.join(directory, MANIFEST)
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        raw = json.load(f)
    fields = {f.name for f in dataclasses.fields(ManifestEntry)}
    entries = []
    for item in raw.get("entries", []):
        values = {name: item.get(name) for name in fields}
        values["written"] = float(values["written"] or 0.0)
        values["step"] = int(values["step"] or 0)
        entries.append(ManifestEntry(**values))
    return entries


def write_manifest(directory: str, entries: Sequence[ManifestEntry]) -> None:
    """Replace the manifest atomically."""
    data = {"format": 1, "entries": [dataclasses.asdict(e) for e in entries]}
    text = json.dumps(data, indent=1)

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    atomic_write(os.path.join(directory, MANIFEST), write)


def sanitize_metric_name(name: str) -> str:
    """A metric name safe inside a filename."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def checkpoint_filename(
    *, epoch: int, step: int, metric: str | None = None, score: float | None = None
) -> str:
    """`epoch-0006-step-4500-loss=0.0416831.safetensors`; no score segment without one.

    The epoch comes first, zero-padded, so lexicographic order is training order.

    Example:
        >>> checkpoint_filename(epoch=6, step=4500, metric="loss", score=0.04168312)
        'epoch-0006-step-4500-loss=0.0416831.safetensors'
        >>> checkpoint_filename(epoch=6, step=4500)
        'epoch-0006-step-4500.safetensors'
    """
    stem = f"epoch-{epoch:04d}-step-{step}"
    if score is not None and metric is not None:
        stem += f"-{sanitize_metric_name(metric)}={score:.6g}"
    return stem + RECORD_SUFFIX


class Selector:
    """A retention rule: which of the candidate entries to keep.

    A custom selector implements `select(entries, checkpointer) -> list[entry]`;
    `admits` defaults to "the new entry is among those selected".
    """

    def select(
        self, entries: Sequence[ManifestEntry], checkpointer: Checkpointer
    ) -> list[ManifestEntry]:
        raise NotImplementedError

    def admits(
        self,
        entries: Sequence[ManifestEntry],
        candidate: ManifestEntry,
        checkpointer: Checkpointer,
    ) -> bool:
        return candidate in self.select([*entries, candidate], checkpointer)


@dataclass(frozen=True)
class Best(Selector):
    """The `k` best entries by the checkpointer's metric and mode."""

    k: int = 1
    among: Selector | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.k, int) or self.k < 1:
            raise ConfigError(f"Best(k) needs k >= 1, got {self.k!r}.")

    def select(
        self, entries: Sequence[ManifestEntry], checkpointer: Checkpointer
    ) -> list[ManifestEntry]:
        pool = (
            list(entries)
            if self.among is None
            else self.among.select(entries, checkpointer)
        )
        scored = [
            e
            for e in pool
            if e.score is not None
            and (e.metric is None or e.metric == checkpointer.metric)
            and (e.mode is None or e.mode == checkpointer.mode)
        ]
        sign = -1.0 if checkpointer.mode == "max" else 1.0
        scored.sort(key=lambda e: (sign * float(e.score), e.epoch))  # type: ignore[arg-type]
        return scored[: self.k]


@dataclass(frozen=True)
class Last(Selector):
    """This run's latest `n` entries, by epoch."""

    n: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.n, int) or self.n < 1:
            raise ConfigError(f"Last(n) needs n >= 1, got {self.n!r}.")

    def select(
        self, entries: Sequence[ManifestEntry], checkpointer: Checkpointer
    ) -> list[ManifestEntry]:
        return sorted(entries, key=lambda e: (e.epoch, e.written))[-self.n :]


def new_run_id() -> str:
    """A short random run id."""
    return uuid.uuid4().hex[:8]


class Checkpointer:
    """Writes a record after each epoch that some selector in `keep` retains.

    Args:
        keep: a selector or a tuple of them; the union of what they pick is kept.
        metric, mode: what to rank by; None follows the run's `monitor`.
        dir: the directory; None is filled with the run directory at setup.
        name: None (the default filename) is the only value supported so far.
        scope: "run" (default) applies retention to this run's files only.

    Example:
        >>> Checkpointer(keep=(Best(3), Last(10)))
        Checkpointer(keep=(Best(k=3, among=None), Last(n=10)), metric=None, mode=None)
    """

    def __init__(
        self,
        keep: Selector | Sequence[Selector] = (Best(3), Last(1)),
        metric: str | None = None,
        mode: str | None = None,
        dir: str | None = None,
        name: Any = None,
        scope: str = "run",
    ) -> None:
        selectors = (keep,) if isinstance(keep, Selector) else tuple(keep)
        if not selectors or not all(isinstance(s, Selector) for s in selectors):
            raise ConfigError(
                f"Checkpointer(keep=...) takes selectors such as Best(3) and Last(1); "
                f"got {keep!r}."
            )
        for selector in selectors:
            if isinstance(selector, Best) and selector.among is not None:
                raise ConfigError(
                    "Best(among=...) is for loading (as in Average); keep refuses it. "
                    "Keep the pool itself instead, e.g. keep=(Best(5), Last(20))."
                )
        if mode is not None and mode not in ("min", "max"):
            raise ConfigError(
                f'Checkpointer mode must be "min" or "max", got {mode!r}.'
            )
        if scope != "run":
            raise NotYetSupportedError(
                f'Checkpointer(scope={scope!r}) is not supported yet; scope="run" is.'
            )
        if name is not None:
            raise NotYetSupportedError(
                "Checkpointer(name=...) is not supported yet; the default filename is."
            )
        self.keep = selectors
        self.metric = metric
        self.mode = mode
        self.dir = dir
        self.scope = scope
        self.run: str | None = None
        self.parent: str | None = None
        self._follows_monitor = metric is None and mode is None

    def __repr__(self) -> str:
        return (
            f"Checkpointer(keep={self.keep!r}, metric={self.metric!r}, "
            f"mode={self.mode!r})"
        )

    @property
    def ranks(self) -> bool:
        """Whether some selector ranks by score (needs a metric)."""
        return any(isinstance(s, Best) for s in self.keep)

    @property
    def has_last(self) -> bool:
        return any(isinstance(s, Last) for s in self.keep)

    def bind(
        self,
        *,
        directory: str,
        monitor: tuple[str, str] | None,
        run: str,
        parent: str | None,
    ) -> None:
        """Fill in what setup resolves: the directory, the metric and the run id."""
        if self.dir is None:
            self.dir = directory
        if self._follows_monitor and monitor is not None:
            self.metric, self.mode = monitor
        self.run = run
        self.parent = parent

    def entries(self) -> list[ManifestEntry]:
        """Every entry of the directory's manifest."""
        return read_manifest(self._directory())

    def _directory(self) -> str:
        if self.dir is None:
            raise CheckpointError("This checkpointer has no directory yet.")
        return self.dir

    def _own(self, entries: Sequence[ManifestEntry]) -> list[ManifestEntry]:
        return [e for e in entries if e.run == self.run]

    def _kept(self, entries: Sequence[ManifestEntry]) -> list[ManifestEntry]:
        kept: list[ManifestEntry] = []
        for selector in self.keep:
            for entry in selector.select(entries, self):
                if entry not in kept:
                    kept.append(entry)
        return kept

    def save(
        self,
        *,
        epoch: int,
        step: int,
        metrics: Mapping[str, Any],
        trees: Mapping[str, Any],
        meta: Mapping[str, Any],
        stop_reason: str | None = None,
    ) -> bool:
        """Write epoch `epoch`'s record if a selector keeps it; rotate the rest.

        Returns False when no selector admits the epoch (nothing is written).
        """
        directory = self._directory()
        score = self._score(metrics)
        all_entries = read_manifest(directory)
        own = self._own(all_entries)
        filename = checkpoint_filename(
            epoch=epoch,
            step=step,
            metric=self.metric if score is not None else None,
            score=score,
        )
        owned = {e.file for e in own}
        others = {e.file for e in all_entries} - owned
        if filename in others or (
            filename not in owned and os.path.exists(os.path.join(directory, filename))
        ):
            filename = filename.replace(
                RECORD_SUFFIX, f"-run-{self.run}{RECORD_SUFFIX}"
            )
        candidate = ManifestEntry(
            file=filename,
            epoch=epoch,
            step=step,
            score=score,
            stop_reason=stop_reason,
            run=self.run,
            metric=self.metric if score is not None else None,
            mode=self.mode if score is not None else None,
            written=time.time(),
            parent=self.parent,
        )
        # A re-trained epoch (a resume that branched nowhere) replaces its old entry.
        own = [e for e in own if e.epoch != epoch]
        kept = self._kept([*own, candidate])
        if candidate not in kept:
            return False
        save_record(
            os.path.join(directory, filename),
            trees,
            {
                **meta,
                "run": self.run,
                "metrics": dict(metrics),
                "stop_reason": stop_reason,
            },
        )
        dropped = [e for e in self._own(all_entries) if e not in kept]
        survivors = [e for e in all_entries if e not in dropped] + [candidate]
        write_manifest(directory, survivors)
        for entry in dropped:
            if entry.file != filename:
                path = os.path.join(directory, entry.file)
                if os.path.exists(path):
                    os.remove(path)
        return True

    def _score(self, metrics: Mapping[str, Any]) -> float | None:
        if self.metric is None or not metrics:
            return None
        if self.metric not in metrics:
            raise CheckpointError(
                f"The checkpointer ranks by `{self.metric}`, but validation returned "
                f"{', '.join(metrics) or 'no metrics'}. Set `monitor` to one of them."
            )
        return check_control_readback(
            metrics[self.metric], "checkpoint metric", self.metric
        )

    def latest(self, run: str | None = None) -> ManifestEntry | None:
        """The newest entry of `run`, or of the run that wrote last."""
        entries = self.entries()
        if not entries:
            return None
        if run is None:
            run = max(entries, key=lambda e: (e.written, e.epoch)).run
        mine = [e for e in entries if e.run == run]
        return max(mine, key=lambda e: (e.epoch, e.written)) if mine else None


def check_control_readback(value: Any, what: str, name: str) -> float:
    """A scalar the framework branches on, validated: finite and real, or raise."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise CheckpointError(
            f"The {what} `{name}` is {value!r}, not a real number."
        ) from None
    if not math.isfinite(number):
        raise CheckpointError(
            f"The {what} `{name}` is {number}; the framework will not rank or stop on "
            f"a non-finite value."
        )
    return number
