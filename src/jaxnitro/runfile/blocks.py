"""What runs between cadence blocks: the due evaluation passes, then the curriculum.

`BlockEnd` is the handle's `on_epoch_end` hook (one engine epoch is one cadence
block). At the end of block `b`, at step `s`:

1. each pass whose period divides `s` (its `:every`, else the cadence), and every
   pass after the run's last step, is evaluated on its own split
   (`nitro.evaluate(name)`); its metrics are named `<pass>/<metric>`, and the
   objective on it `<pass>/objective`. They join the block's validate line, its
   history row and its checkpoint's metrics.
2. the `curriculum`, when the file defines one, gets the stage in effect, `ctx` and
   the observations (`curriculum.py`); the stage it returns is applied to the next
   blocks (its learning-rate scale and loader), logged as `curriculum/stage` and
   written to `curriculum.json`, all before the block's checkpoint. It runs after
   the last block too, so a longer run resumed from there continues in its stage.

At the first block end of a handle it also notes, in the run dir's
`sexpgpu-runs.json`, that the engine's run is of this run file (`rundir`).
"""

from __future__ import annotations

from typing import Any

from .curriculum import StageFile, keyword_items, stage_settings
from .engine import CompiledRun
from .evaluator import Evaluator
from .knobs import Selection
from .rundir import RunsFile, file_digest
from .stdlib_data import LoaderSpec
from .values import show


def pass_metrics(name: str, metrics: dict[str, Any]) -> dict[str, Any]:
    """A pass's engine metrics under its name: `objective` -> `<pass>/objective`,
    `eval/<m>` -> `<pass>/<m>` (a metric `evaluate` names `:objective` wins)."""
    named = {f"{name}/objective": metrics["objective"]}
    for key, value in metrics.items():
        if key.startswith("eval/"):
            named[f"{name}/{key[5:]}"] = value
    return named


class BlockEnd:
    """The `on_epoch_end` hook of a run file's handle (see the module docstring)."""

    def __init__(self, compiled: CompiledRun, run_dir: str) -> None:
        self.compiled = compiled
        self.stages = StageFile(run_dir)
        self.stage: Any = None
        self.last_passes: dict[str, Any] = {}
        """The metrics of the latest evaluation of each pass (the report reads it)."""
        self.runs = RunsFile(run_dir)
        self.digest = file_digest(compiled.path)
        self.noted = False

    def stage_text(self, stage: Any) -> str:
        """A stage as the run file would write it; a loader bound by a top-level
        definition is shown by its name."""
        if isinstance(stage, tuple):
            return "[" + " ".join(self.stage_text(v) for v in stage) + "]"
        if isinstance(stage, LoaderSpec):
            result = self.compiled.result
            for name in result.defined:
                if result.value(name) == stage:
                    return name
            return "<loader>"
        return show(stage)

    def resume_at(self, step: int, nitro: Any) -> None:
        """Continue in the stage recorded after `step` (a resumed run)."""
        if self.compiled.has_curriculum and step > 0:
            self.apply(self.stages.stage_at(step), nitro)

    def apply(self, stage: Any, nitro: Any) -> None:
        """Make `stage` the one in effect: its learning-rate scale and loader."""
        compiled = self.compiled
        span = compiled.result.defined.get("curriculum")
        scale, loader = stage_settings(stage, compiled.train_loader, span)
        compiled.lr_scale[0] = scale
        nitro.data["train"].use(compiled.record_stream(loader))
        self.stage = stage

    def __call__(
        self, nitro: Any, epoch: int, observations: dict[str, Any]
    ) -> dict[str, Any]:
        compiled = self.compiled
        if not self.noted and nitro.checkpoint_run is not None:
            self.runs.note(nitro.checkpoint_run, compiled.path, self.digest)
            self.noted = True
        step = nitro.current_step
        final = step >= compiled.run.steps
        added: dict[str, Any] = {}
        for name, spec in compiled.eval_passes:
            if final or step % compiled.every(spec) == 0:
                found = pass_metrics(name, nitro.evaluate(name))
                self.last_passes[name] = (step, found)
                added.update(found)
        if compiled.has_curriculum:
            self._curriculum(nitro, epoch, step, {**observations, **added})
        return added

    def _curriculum(
        self, nitro: Any, epoch: int, step: int, observations: dict[str, Any]
    ) -> None:
        compiled = self.compiled
        result = compiled.result
        span = result.defined["curriculum"]
        seen = {
            "train/loss" if k == "train_loss" else k: float(v)
            for k, v in observations.items()
            if isinstance(v, int | float) or getattr(v, "ndim", None) == 0
        }
        ctx = {
            "step": step,
            "block": epoch,
            "blocks": compiled.plan.epochs,
            "steps": compiled.run.steps,
            "knobs": keyword_items({n: k.value for n, k in result.knobs.knobs.items()}),
        }
        ev = Evaluator(compiled.path, Selection(), ())
        stage = ev.call(
            result.value("curriculum"),
            [self.stage, keyword_items(ctx), keyword_items(seen)],
            span,
        )
        self.apply(stage, nitro)
        self.stages.write(step, stage)
        if nitro.logger is not None:
            nitro.logger.log_metrics(
                {"curriculum/stage": self.stage_text(stage)},
                step=step,
                epoch=epoch,
                context="curriculum",
            )
