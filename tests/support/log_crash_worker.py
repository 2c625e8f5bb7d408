"""A training process for tests/logging/test_jsonl.py that is SIGKILLed while its
JSON-lines log is being written.

    python log_crash_worker.py RUN_DIR EPOCH

It trains `Tiny(max_epochs=4)` in RUN_DIR with the default logger, a train line every
step. When the logger writes the train lines of EPOCH, the process writes that text
up to 20 characters into its last line, hands it to the operating system and kills
itself with SIGKILL: the log ends in a partial line, as a crash in the middle of a
write leaves it.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any


class TornFile:
    """The logger's file; the write holding `marker` is cut short, then the kill."""

    def __init__(self, file: Any, marker: str) -> None:
        self.file, self.marker = file, marker

    def write(self, text: str) -> int:
        if self.marker in text:
            last = text.rstrip("\n").rfind("\n") + 1  # where the last line starts
            self.file.write(text[: last + 20])
            self.file.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        return self.file.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.file, name)


def main(run_dir: str, epoch: int) -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from experiments import Tiny

    import jaxnitro as nx
    from jaxnitro.logging.jsonl import JSONLogger

    real_open = JSONLogger._open
    marker = f'"context": "train", "epoch": {epoch},'
    JSONLogger._open = lambda self: TornFile(real_open(self), marker)  # type: ignore[method-assign]
    nx.Nitro(Tiny(max_epochs=4), run_dir=run_dir, log_every_n_steps=1).train()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
