"""The epoch-summary progress reporter: for output nobody watches live.

A log file, `nohup`, a CI job: stderr is no terminal, so no bar is drawn, and a
redrawn line would only litter the file. This reporter writes one line per epoch
instead, `epoch 3/40: train_loss 0.4123 · val acc 0.9031 · val loss 0.3812 · 2.1 s`,
and nothing else. `jaxnitro.progress_reporter(None)` turns it off with the rest of
the progress output.

Example:
    >>> import io
    >>> out = io.StringIO()
    >>> reporter = SummaryReporter(stream=out)
    >>> reporter("begin", "train", 4, 1, 2); reporter("step", "", 0, 0, 0)
    >>> reporter("epoch", "epoch 1/2: train_loss 0.5 · 0.1 s", 0, 1, 2)
    >>> out.getvalue()
    'epoch 1/2: train_loss 0.5 · 0.1 s\\n'
"""

from __future__ import annotations

import sys
from typing import TextIO


class SummaryReporter:
    """A progress reporter writing each epoch's summary line ("epoch" verb).

    Args:
        stream: where lines go; default `sys.stderr`, read at each write (so a
            redirected or captured stderr receives them).
    """

    def __init__(self, *, stream: TextIO | None = None) -> None:
        self._stream = stream

    def __call__(
        self, verb: str, label: str, total: int, epoch: int, max_epochs: int
    ) -> None:
        if verb != "epoch":
            return
        stream = self._stream if self._stream is not None else sys.stderr
        if stream is None:  # pythonw: no stderr at all
            return
        stream.write(label + "\n")
        stream.flush()
