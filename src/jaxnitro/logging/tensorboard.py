"""`TensorBoardLogger`: TensorBoard event files through tensorboardX.

Needs the `tensorboard` extra (`pip install 'jaxnitro[tensorboard]'`); tensorboardX is
imported when the first event is written, so constructing the logger needs nothing.

What each verb writes, with the optimizer step on the x axis:

    log_metrics   a scalar per number, tagged "<context>/<name>" ("train/loss",
                  "train_epoch/loss", the epoch's mean, "validate/acc",
                  "data/data_wait_frac"); another value as text
    log_params    the HParams dashboard's session, and a Markdown table "params"
    log_other     text "<key>" ("binding_report")
    log_tags      text "tags"
    log_confusion text "confusion", a Markdown table with the labels and epoch
    finish        text "status", then the event file is closed

A resumed run continues the same log directory: `logger_state` records it with the last
step logged, and `reattach` opens a new event file there that purges the steps after
that one, so the events a crashed process wrote past its checkpoint are hidden.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..extras import require
from .values import as_scalar, as_text, flatten, markdown_table

NO_LOGDIR = (
    "TensorBoardLogger has no log directory yet: pass one "
    "(TensorBoardLogger('runs/x/tensorboard')), or let a Nitro bind it to the run "
    "directory."
)
BAD_STATE = (
    "TensorBoardLogger.reattach needs the state logger_state() returned, a dict with "
    "a 'logdir' (and the last 'step'); got {value!r}. Resume with the logger type "
    "that wrote the checkpoint, or start a new logged run with weights= instead of "
    "resume=."
)


class TensorBoardLogger:
    """Writes TensorBoard event files to `logdir`, or `tensorboard/` in the run dir.

    Args:
        logdir: the run's event directory; None lets setup bind it to
            `<run_dir>/tensorboard`.
        flush_secs: how often pending events reach the file.

    Examples:
        >>> lg = TensorBoardLogger("runs/exp/tensorboard")
        >>> lg.logger_info()["view"]
        'tensorboard --logdir runs/exp/tensorboard'
    """

    def __init__(
        self, logdir: str | os.PathLike[str] | None = None, *, flush_secs: int = 10
    ) -> None:
        self.logdir = os.fspath(logdir) if logdir is not None else None
        self.flush_secs = flush_secs
        self._explicit = logdir is not None
        self._writer: Any = None
        self._purge_step: int | None = None
        self._last_step: int | None = None

    def bind_run_dir(self, run_dir: str) -> None:
        """Give a pathless logger `<run_dir>/tensorboard` (done at setup)."""
        if self.logdir is None:
            self.logdir = os.path.join(run_dir, "tensorboard")

    def backend(self) -> Any:
        """The `tensorboardX.SummaryWriter`, for images, histograms, graphs..."""
        if self.logdir is None:
            raise ConfigError(NO_LOGDIR)
        if self._writer is None:
            tbx = require(
                "tensorboardX", extra="tensorboard", feature="TensorBoardLogger"
            )
            # A nanosecond suffix keeps two writers in one second from sharing (and
            # truncating) a file, and sorts them in the order they were opened.
            self._writer = tbx.SummaryWriter(
                logdir=self.logdir,
                flush_secs=self.flush_secs,
                filename_suffix=f".{time.time_ns()}",
                purge_step=self._purge_step,
            )
            self._purge_step = None
        return self._writer

    def _step(self) -> int:
        return self._last_step if self._last_step is not None else 0

    def _text(
        self, tag: str, value: Any, step: int | None = None, *, markdown: bool = False
    ) -> None:
        """Text at `step` (default: the last step logged); Markdown passes as is."""
        text = value if markdown else as_text(value)
        self.backend().add_text(tag, text, self._step() if step is None else step)

    # ------------------------------------------------------------ the verbs ------
    def log_metrics(
        self,
        metrics: dict[str, Any],
        *,
        step: int,
        epoch: int,
        context: str,
        **kwargs: Any,
    ) -> None:
        """Numbers as scalars "<context>/<name>" at `step`; other values as text."""
        writer = self.backend()
        for name, value in metrics.items():
            tag = f"{context}/{name}"
            ok, plain = as_scalar(value)
            if ok and plain is not None:
                writer.add_scalar(tag, float(plain), step)
            else:
                self._text(tag, value, step)
        self._last_step = max(step, self._step())

    def log_params(self, params: dict[str, Any]) -> None:
        """The HParams dashboard's session values, and a Markdown table "params"."""
        hparams = require(
            "tensorboardX.summary", extra="tensorboard", feature="TensorBoardLogger"
        ).hparams
        flat = flatten(params)
        typed = {
            k: v if isinstance(v, bool | int | float | str) else repr(v)
            for k, v in ((k, as_scalar(v)[1]) for k, v in flat.items())
            if v is not None
        }
        writer = self.backend()
        for summary in hparams(typed, {}):
            writer.file_writer.add_summary(summary, self._step())
        rows = [[k, repr(v)] for k, v in flat.items()]
        self._text("params", markdown_table(["param", "value"], rows), markdown=True)

    def log_other(self, key: str, value: Any) -> None:
        """A free-form value as text under `key`."""
        self._text(key, value)

    def log_tags(self, tags: Any) -> None:
        """Tags as text: a list of names, or `name: value` lines for a mapping."""
        if isinstance(tags, Mapping):
            lines = [f"- {k}: {v}" for k, v in tags.items()]
        else:
            lines = [f"- {t}" for t in ([tags] if isinstance(tags, str) else tags)]
        self._text("tags", "\n".join(lines), markdown=True)

    def log_confusion(self, matrix: Any, labels: Any, *, epoch: int) -> None:
        """A confusion matrix as a Markdown table "confusion", at the last step."""
        array = np.asarray(matrix)
        names = [str(n) for n in labels]
        rows = [[f"**{names[i]}**", *row.tolist()] for i, row in enumerate(array)]
        table = markdown_table(["true \\ predicted", *names], rows)
        self._text("confusion", f"Epoch {epoch}\n\n" + table, markdown=True)

    def finish(self, status: str) -> None:
        """Write the run's outcome as text "status", then close the event file."""
        self._text("status", status)
        self.close()

    def close(self) -> None:
        """Flush and close the event file; the next event opens a new one."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    # ------------------------------------------------------------ identity -------
    def run_id(self) -> str | None:
        """The log directory, which is what names a run in TensorBoard."""
        return self.logdir

    def run_url(self) -> None:
        """None: event files have no URL until a TensorBoard server serves them."""
        return None

    def logger_info(self) -> dict[str, Any]:
        """The log directory and the command that shows it."""
        view = None if self.logdir is None else f"tensorboard --logdir {self.logdir}"
        return {"logdir": self.logdir, "view": view}

    def logger_state(self) -> dict[str, Any] | None:
        """`{"logdir", "step"}`: where a resumed run continues, and from which step."""
        if self.logdir is None:
            return None
        return {"logdir": self.logdir, "step": self._last_step}

    def reattach(self, state: Any) -> None:
        """Continue the run `state` names, hiding the events after its step.

        A logger constructed with its own `logdir` keeps it; a pathless one (bound
        by setup) takes the recorded directory.
        """
        if not isinstance(state, Mapping) or not isinstance(state.get("logdir"), str):
            raise ConfigError(BAD_STATE.format(value=state))
        if not self._explicit:
            self.logdir = state["logdir"]
        step = state.get("step")
        self.close()
        self._last_step = step if isinstance(step, int) else None
        self._purge_step = step + 1 if isinstance(step, int) else None

    def __repr__(self) -> str:
        return f"TensorBoardLogger({self.logdir!r})"
