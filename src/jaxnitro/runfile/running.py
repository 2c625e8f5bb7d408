"""`sexpgpu run`: train a run file on the engine and report its end.

The run ends with `done: N steps, train/loss X` and one `counter` line per
counter: `records` (records the train loader delivered: steps x microbatches x
batch size) and `tokens` (their elements of a field named `tokens`, when the
loader declares one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .engine import compile_run, experiment, handle_keywords
from .knobs import Selection


@dataclass(frozen=True)
class RunOutcome:
    """What a finished run reports: its steps, last train loss, counters, handle."""

    steps: int
    train_loss: float
    counters: dict[str, int]
    handle: Any

    def lines(self) -> list[str]:
        """The closing lines `sexpgpu run` prints."""
        done = f"done: {self.steps} steps, train/loss {self.train_loss:.4f}"
        return [done] + [f"  counter {k} {v}" for k, v in self.counters.items()]


def run_file(
    path: str,
    selection: Selection | None = None,
    *,
    steps: int | None = None,
    run_dir: str | None = None,
) -> RunOutcome:
    """Check, compile and train the run file at `path`; what it reports at the end.

    Raises:
        RunfileError: any coded diagnostic, before the first step where possible.
    """
    import jaxnitro as nx

    compiled = compile_run(path, selection, steps=steps)
    handle = nx.Nitro(experiment(compiled), **handle_keywords(compiled, run_dir))
    handle.train()
    rows = list(handle.history)
    done = int(rows[-1]["step"]) if rows else 0
    loader = compiled.train_loader
    records = done * compiled.run.microbatches * loader.batch_size
    counters = {"records": records}
    tokens = next((f for f in loader.fields if f.name == "tokens"), None)
    if tokens is not None:
        size = 1
        for n in tokens.shape:
            size *= n
        counters["tokens"] = records * size
    loss = float(rows[-1]["train_loss"]) if rows else float("nan")
    return RunOutcome(done, loss, counters, handle)
