"""`sexpgpu run`: train a run file on the engine and report its end.

The run ends with the latest metrics of each evaluation pass, `done: N steps,
train/loss X` and one `counter` line per counter: `records` (records the train
loader delivered: steps x microbatches x batch size) and `tokens` (their elements
of a field named `tokens`, when the loader declares one).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .blocks import BlockEnd
from .engine import CompiledRun, compile_run, experiment, handle_keywords
from .knobs import Selection
from .source import counted


@dataclass(frozen=True)
class RunOutcome:
    """What a finished run reports: its steps, last train loss, counters, handle,
    and each pass's latest metrics with their step."""

    steps: int
    train_loss: float
    counters: dict[str, int]
    handle: Any
    passes: dict[str, tuple[int, dict[str, Any]]] = field(default_factory=dict)

    def lines(self) -> list[str]:
        """The closing lines `sexpgpu run` prints."""
        found = [
            f"eval {name} at step {step}: "
            + ", ".join(f"{k} {float(v):.4f}" for k, v in metrics.items())
            for name, (step, metrics) in self.passes.items()
        ]
        done = f"done: {counted(self.steps, 'step')}, train/loss {self.train_loss:.4f}"
        return [*found, done] + [f"  counter {k} {v}" for k, v in self.counters.items()]


def build_handle(
    compiled: CompiledRun, run_dir: str | None = None, **keywords: Any
) -> tuple[Any, BlockEnd]:
    """The engine handle of a compiled run, with its block-end hook registered
    (and, for a resumed run, the curriculum stage its record was written under).

    `keywords` add to or replace `handle_keywords` (`resume="auto"`, say).
    """
    import jaxnitro as nx

    run = {**handle_keywords(compiled, run_dir), **keywords}
    handle = nx.Nitro(experiment(compiled), **run)
    end = BlockEnd(compiled, handle.run_dir)
    end.resume_at(handle.current_step, handle)
    handle.on_epoch_end(end)
    return handle, end


def counters(compiled: CompiledRun, steps: int) -> dict[str, int]:
    """`records` (steps x microbatches x batch size) and, for a field named
    `tokens`, `tokens` (records x its elements)."""
    loader = compiled.train_loader
    records = steps * compiled.run.microbatches * loader.batch_size
    found = {"records": records}
    tokens = next((f for f in loader.fields if f.name == "tokens"), None)
    if tokens is not None:
        size = 1
        for n in tokens.shape:
            size *= n
        found["tokens"] = records * size
    return found


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
    compiled = compile_run(path, selection, steps=steps)
    handle, end = build_handle(compiled, run_dir)
    handle.train()
    rows = list(handle.history)
    done = int(rows[-1]["step"]) if rows else 0
    loss = float(rows[-1]["train_loss"]) if rows else float("nan")
    return RunOutcome(
        done, loss, counters(compiled, done), handle, dict(end.last_passes)
    )
