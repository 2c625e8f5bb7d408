"""The state of one progress line: what the bar draws and the log reporter writes.

One line per entry point. It reads `epoch 3/40: train [compiling gradient] (note) ·
loss 0.4123 · val acc 0.9031`: the epoch position when the stretch has one, the
stretch's label, the current phase in brackets, the user's note in parentheses, and
the latest values the loop shows (the train loss, the monitored validation metric),
which stay on the line from stretch to stretch. Setup reads `setup [building data]`.
The line ends with a closing text, by default `done: 40/40 epochs` (or `setup done`
for a stretch without epochs).

The fraction is the run's, so the ETA is the run's: within a training run it is
`(epoch - 1 + units done / units) / max_epochs`, and it never moves back, so the
validation stretch after an epoch's training holds it. A stretch without epochs fills
by its own units; one of unknown length has no fraction (None).

Example:
    >>> line = ProgressLine()
    >>> line.begin("train", 4, 3, 40)
    >>> line.phase = "compiling gradient"
    >>> line.description()
    'epoch 3/40: train [compiling gradient]'
    >>> line.step(); line.step()
    >>> round(line.fraction or 0, 4)
    0.0625
    >>> line.closing("")
    'done: 3/40 epochs'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .number_format import format_number, format_seconds


def stretch_name(label: str, epoch: int, max_epochs: int) -> str:
    """`epoch 3/40: train`, or the label alone for a stretch without epochs."""
    if max_epochs > 0 and epoch > 0:
        return f"epoch {epoch}/{max_epochs}: {label}"
    return label


class ProgressLine:
    """One entry point's line: the current stretch, phase, note and run fraction."""

    __slots__ = (
        "label",
        "total",
        "done",
        "epoch",
        "max_epochs",
        "phase",
        "note",
        "values",
        "_run_fraction",
    )

    def __init__(self) -> None:
        self.label = ""
        self.total = 0
        self.done = 0
        self.epoch = 0
        self.max_epochs = 0
        self.phase = ""
        self.note = ""
        self.values = ""
        self._run_fraction = 0.0

    def begin(self, label: str, total: int, epoch: int, max_epochs: int) -> None:
        """A new stretch: its label, total units (0 if unknown) and epoch position."""
        self.label = label
        self.total = max(int(total), 0)
        self.done = 0
        self.epoch = int(epoch)
        self.max_epochs = int(max_epochs)
        self.phase = ""
        self.note = ""
        if self._has_epochs():
            self._advance()

    def step(self, count: int = 1) -> None:
        """`count` units of the stretch completed (one by default)."""
        self.done += count
        if self._has_epochs():
            self._advance()

    def set_phase(self, label: str) -> None:
        """What the stretch is doing besides its units ("" when it resumes them)."""
        self.phase = label
        self.note = ""

    @property
    def fraction(self) -> float | None:
        """The fraction of the run (or of this stretch) done; None if unknown."""
        if self._has_epochs():
            return self._run_fraction
        if self.total > 0:
            return min(self.done / self.total, 1.0)
        return None

    def description(self) -> str:
        """`epoch 3/40: train [compiling gradient] (decoding 3/5) · loss 0.4123`."""
        text = stretch_name(self.label, self.epoch, self.max_epochs)
        if self.phase:
            text += f" [{self.phase}]"
        if self.note:
            text += f" ({self.note})"
        if self.values:
            text += f" · {self.values}"
        return text

    def closing(self, text: str) -> str:
        """The line's last words: `text`, or the default for how far the run got."""
        if text:
            return text
        if self._has_epochs():
            return f"done: {self.epoch}/{self.max_epochs} epochs"
        return f"{self.label} done" if self.label else "done"

    def _has_epochs(self) -> bool:
        return self.max_epochs > 0 and self.epoch > 0

    def _advance(self) -> None:
        within = min(self.done / self.total, 1.0) if self.total > 0 else 0.0
        now = min((self.epoch - 1 + within) / self.max_epochs, 1.0)
        self._run_fraction = max(self._run_fraction, now)


def format_values(values: Mapping[str, float]) -> str:
    """`loss 0.4123 · val acc 0.9031`: each value by `format_number`'s rule.

    >>> format_values({"loss": 0.412345, "val acc": 1.0})
    'loss 0.4123 · val acc 1.0'
    """
    return " · ".join(
        f"{name} {format_number(value)}" for name, value in values.items()
    )


def epoch_summary(row: Mapping[str, Any], max_epochs: int) -> str:
    """One epoch's summary line from its history row: the epoch, the train loss,
    every scalar validation metric, and the epoch's seconds.

    >>> row = {"epoch": 2, "step": 8, "train_loss": 0.52, "acc": 1.0, "loss": 0.4,
    ...        "seconds": 1.234}
    >>> epoch_summary(row, 5)
    'epoch 2/5: train_loss 0.52 · val acc 1.0 · val loss 0.4 · 1.2 s'
    """
    shown = {"train_loss": row["train_loss"]}
    for name, value in row.items():
        if name in ("epoch", "step", "train_loss", "seconds"):
            continue
        if isinstance(value, int | float | np.number) and not isinstance(value, bool):
            shown[f"val {name}"] = value
    return (
        f"epoch {row['epoch']}/{max_epochs}: {format_values(shown)} · "
        f"{format_seconds(row['seconds'])} s"
    )
