"""`sexpgpu run`: train a run file on the engine and report its end.

The run ends with the latest metrics of each evaluation pass, `done: N steps,
train/loss X` and one `counter` line per counter: `records` (records the train
loader delivered: steps x microbatches x batch size) and `tokens` (their elements
of a field named `tokens`, when the loader declares one).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..observe.number_format import format_number
from .blocks import BlockEnd
from .engine import (
    CompiledRun,
    compile_run,
    default_run_dir,
    experiment,
    handle_keywords,
)
from .knobs import Selection
from .rundir import plan_start
from .source import counted


@dataclass(frozen=True)
class RunOutcome:
    """What a finished run reports: its steps, last train loss, counters, handle,
    and each pass's latest metrics with their step."""

    steps: int
    train_loss: float | None
    """The objective's mean over the last block; None when nothing was trained
    (a resumed run already at its steps)."""
    counters: dict[str, int]
    handle: Any
    passes: dict[str, tuple[int, dict[str, Any]]] = field(default_factory=dict)

    def lines(self) -> list[str]:
        """The closing lines `sexpgpu run` prints."""
        found = [
            f"eval {name} at step {step}: "
            + ", ".join(f"{k} {format_number(float(v))}" for k, v in metrics.items())
            for name, (step, metrics) in self.passes.items()
        ]
        done = f"done: {counted(self.steps, 'step')}, " + (
            "nothing trained"
            if self.train_loss is None
            else f"train/loss {format_number(self.train_loss)}"
        )
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
    resume: bool = False,
    announce: Callable[[str], None] | None = None,
) -> RunOutcome:
    """Check, compile and train the run file at `path`; what it reports at the end.

    Args:
        path: the run file.
        selection: the variant, sweep point and `--set` values.
        steps: replaces defrun's `:steps`.
        run_dir: where checkpoints and logs go (`runs/<file name>`).
        resume: continue the latest run of this file in the run dir (`--resume
            auto`; a new run when it holds none); see `rundir.plan_start`.
        announce: receives the lines said before the first step: what the run
            dir already holds of this file, and what is resumed.

    Raises:
        RunfileError: any coded diagnostic, before the first step where possible.
    """
    compiled = compile_run(path, selection, steps=steps)
    start = plan_start(path, run_dir or default_run_dir(path), resume=resume)
    for line in start.lines:
        if announce is not None:
            announce(line)
    keywords = {"resume": start.resume} if start.resume else {}
    handle, end = build_handle(compiled, run_dir, **keywords)
    if handle.current_step >= compiled.run.steps:  # a resumed run already done
        if announce is not None:
            announce(
                f"the run is already at step {handle.current_step} of "
                f"{compiled.run.steps}: nothing to train (--steps N trains it on "
                "to step N)"
            )
        handle.release()
        done = handle.current_step
        return RunOutcome(done, None, counters(compiled, done), handle)
    handle.train()
    rows = list(handle.history)
    done = int(rows[-1]["step"]) if rows else 0
    loss = float(rows[-1]["train_loss"]) if rows else float("nan")
    return RunOutcome(
        done, loss, counters(compiled, done), handle, dict(end.last_passes)
    )
