"""A checked run file compiled onto the engine: an `Experiment` and its keywords.

What maps to what:

- `train-loader` is the split `train` and each `defeval` pass a split of its own
  name (`streams`); `:steps` and `:cadence` become epochs (`cadence`), and the
  passes and the `curriculum` run at each epoch end (`blocks`).
- `forward` is `prepare` (or `eval-prepare` outside training) then the model; it
  returns `(prediction, targets)`, `loss` is `objective` of them, and `metrics` is
  `evaluate` with the objective beside it (traced, on the device).
- The optimizer's groups are engine parameter groups, each with its own Optax rule;
  every group's learning rate (a number or a schedule), betas and eps are schedule
  entries, so they reach the programs as inputs: a learning-rate sweep compiles
  nothing new. The decay coefficient is the engine's decoupled `weight_decay`.
- `:microbatches` is `accum`, `:precision` the `precision` keyword, `:seed` the seed.

The experiment's one GraphConst field, `graph`, is a digest of what the traced code
computes: the jaxprs of the train objective and of each evaluation pass, traced on
the declared shapes. Two knob settings that trace the same computation (they differ
only in what schedules and hyperparameters read) share the key, so the engine's
compile cache serves the second from the first. The traced hooks find the run
file's functions through that key in `_TRACED`.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import Any

import jaxnitro as nx

from ..experiment.modes import training_mode
from .cadence import CadencePlan, cadence_plan
from .evaluator import Evaluated, Evaluator
from .knobs import Selection
from .nn_cudnn import shapes_only
from .nn_models import ModelSpec
from .records import read_records
from .source import fail
from .stdlib_data import Batch, EvalSpec, LoaderSpec, RunSpec, check_steps
from .stdlib_nn import flatten, nest
from .stdlib_optim import OptimizerSpec, ScheduleSpec, schedule_value
from .streams import RecordStream, TrainBlocks, eval_batches, train_split
from .values import keyword_list

ADAM_DEFAULTS = {"betas": (0.9, 0.999), "eps": 1e-8, "weight-decay": 0.0}
SGD_DEFAULTS = {"momentum": 0.0, "weight-decay": 0.0}


@dataclass(frozen=True)
class GroupSettings:
    """One update group: its selection as written and its resolved settings."""

    name: str
    selection: str
    lr: float | ScheduleSpec
    betas: tuple[float, float] | None
    eps: float | None
    weight_decay: float
    momentum: float | None
    parameters: tuple[str, ...]


@dataclass(frozen=True)
class CompiledRun:
    """A run file ready for the engine: its definitions, groups, epochs and key."""

    path: str
    result: Evaluated = field(repr=False)
    model: ModelSpec
    optimizer: OptimizerSpec
    run: RunSpec
    plan: CadencePlan
    groups: tuple[GroupSettings, ...]
    graph: str
    lr_scale: list[float] = field(default_factory=lambda: [1.0], compare=False)
    """The current stage's `:lr-scale` (one item, set between blocks)."""
    streams: dict[LoaderSpec, RecordStream] = field(
        default_factory=dict, compare=False, repr=False
    )

    @property
    def train_loader(self) -> LoaderSpec:
        """The `train-loader` declaration."""
        return self.result.value("train-loader")  # type: ignore[no-any-return]

    @property
    def eval_passes(self) -> list[tuple[str, EvalSpec]]:
        """The `defeval` passes in file order: each is a split of its name."""
        return [(name, spec) for name, spec, _ in self.result.evals]

    @property
    def has_curriculum(self) -> bool:
        """Whether the file defines `curriculum`."""
        return "curriculum" in self.result.defined

    def every(self, spec: EvalSpec) -> int:
        """A pass's period in steps: its `:every`, else defrun's cadence."""
        return spec.every or self.run.cadence

    def record_stream(self, loader: LoaderSpec) -> RecordStream:
        """The endless record stream of a train loader, read once per run.

        Raises:
            RunfileError: E-LOAD diagnostics of a missing file or a bad record.
        """
        found = self.streams.get(loader)
        if found is None:
            base = os.path.dirname(os.path.abspath(self.path))
            found = RecordStream(read_records(loader, base), self.run.seed)
            self.streams[loader] = found
        return found

    def group_of(self, parameter: str) -> str:
        """The engine group of a parameter's dotted name."""
        return next(g.name for g in self.groups if parameter in g.parameters)

    def schedule(self, group: GroupSettings) -> Any:
        """One group's learning rate as a schedule entry: a number when it is
        constant (the engine then computes nothing per step), else `step -> rate`
        over the run's steps."""
        rate, steps = group.lr, self.run.steps
        if self.has_curriculum:  # a stage may scale it between blocks
            scale = self.lr_scale
            return lambda step: schedule_value(rate, int(step), steps) * scale[0]
        if not isinstance(rate, ScheduleSpec) or rate.name == "constant":
            return schedule_value(rate, 0, steps)
        return lambda step: schedule_value(rate, int(step), steps)

    def parts(self, params: Any, batch: dict[str, Any], *, train: bool) -> Any:
        """`(prediction, targets)` of one batch: (eval-)prepare, then the model."""
        result = self.result
        prep = result.value("prepare")
        if not train and "eval-prepare" in result.defined:
            prep = result.value("eval-prepare")
        span = result.defined["prepare"]
        ev = Evaluator(self.path, Selection(), ())
        prepared = keyword_list(ev.call(prep, [Batch(dict(batch))], span))
        assert prepared is not None  # check_file traced prepare on these shapes
        flat = flatten(params) if isinstance(params.get("model"), dict) else params
        prediction = self.model.apply(flat, prepared["inputs"], span)
        return prediction, prepared["targets"]

    def objective(self, prediction: Any, targets: Any) -> Any:
        """The run file's `objective` of one batch (a float scalar)."""
        ev = Evaluator(self.path, Selection(), ())
        span = self.result.defined["objective"]
        return ev.call(self.result.value("objective"), [prediction, targets], span)

    def evaluate(self, prediction: Any, targets: Any) -> dict[str, Any]:
        """The run file's `evaluate` of one batch: metric name -> float scalar."""
        if "evaluate" not in self.result.defined:
            return {}
        ev = Evaluator(self.path, Selection(), ())
        span = self.result.defined["evaluate"]
        value = ev.call(self.result.value("evaluate"), [prediction, targets], span)
        return dict(keyword_list(value) or {})

    def splits(self) -> dict[str, Any]:
        """The engine's splits: `train` in cadence blocks, one per pass by name.

        Raises:
            RunfileError: E-LOAD diagnostics of a missing file or a bad record.
        """
        base = os.path.dirname(os.path.abspath(self.path))
        loader = self.train_loader
        blocks = TrainBlocks(
            self.record_stream(loader),
            loader.batch_size,
            self.plan.batches_per_epoch,
        )
        data: dict[str, Any] = {"train": train_split(blocks)}
        for name, spec in self.eval_passes:
            records = read_records(spec.loader, base)
            data[name] = eval_batches(records, spec.loader.batch_size, spec.batches)
        return data


_TRACED: dict[str, CompiledRun] = {}
"""Graph key -> a compiled run whose traced functions compute what the key names."""


class RunfileExperiment(nx.Experiment):
    """The engine's view of a run file: hooks over a `CompiledRun`."""

    graph: nx.GraphConst[str] = ""
    """The digest of the traced computation (see the module docstring)."""

    compiled: Any = None
    """The `CompiledRun` (Host: read on the driver only)."""

    def build_data(self, dist: Any) -> dict[str, Any]:
        del dist
        return self.compiled.splits()  # type: ignore[no-any-return]

    def build_model(self, rng: Any) -> tuple[Any, Any, Any]:
        model = self.compiled.model
        model.check_backend(self.compiled.result.defined["model"])
        return None, nest(model.init(rng)), {}

    def forward(self, model: Any, params: Any, state: Any, **batch: Any) -> Any:
        run = _TRACED[self.graph]
        return run.parts(params, batch, train=nx.training()), state

    def loss(self, outputs: Any) -> Any:
        prediction, targets = outputs
        return _TRACED[self.graph].objective(prediction, targets)

    def metrics(self, outputs: Any) -> dict[str, Any]:
        # The objective beside `evaluate`'s metrics; `blocks` names them by pass.
        prediction, targets = outputs
        run = _TRACED[self.graph]
        found = {"objective": (run.objective(prediction, targets), 1)}
        for name, value in run.evaluate(prediction, targets).items():
            found[f"eval/{name}"] = (value, 1)
        return found

    def metrics_residency(self, hook: str) -> str:
        return "device"

    def param_group(self, keypath: Any) -> str:
        return self.compiled.group_of(".".join(str(k) for k in keypath))  # type: ignore[no-any-return]

    def optimizer(self, group: str) -> Any:
        import optax

        return optax.adam if self.compiled.optimizer.rule == "adamw" else optax.sgd

    def learning_rate(self, group: str | None = None) -> float:
        # Ratio 1 for every group: each group's own rate is a schedule entry.
        return 1.0

    def weight_decay(self, group: str | None = None) -> float:
        settings = {g.name: g for g in self.compiled.groups}
        return settings[group].weight_decay if group in settings else 0.0

    def no_decay(self, keypath: Any, leaf: Any) -> bool:
        # The run file's groups say what decays; no leaf is exempt by its rank.
        return False

    def schedules(self) -> dict[str, Any]:
        entries: dict[str, Any] = {}
        for g in self.compiled.groups:
            own: dict[str, Any] = {"learning_rate": self.compiled.schedule(g)}
            if g.betas is not None:
                own["b1"], own["b2"] = g.betas
            if g.eps is not None:
                own["eps"] = g.eps
            if g.momentum:
                own["momentum"] = g.momentum
            entries[g.name] = own
        return {"opt": entries}


def _groups(optimizer: OptimizerSpec, model: ModelSpec) -> tuple[GroupSettings, ...]:
    shapes = model.parameter_shapes()
    held = optimizer.assign(shapes)
    defaults = ADAM_DEFAULTS if optimizer.rule == "adamw" else SGD_DEFAULTS
    base = {**defaults, **optimizer.settings}
    written = {str(g.select): g for g in optimizer.groups}
    found = []
    for index, (selection, names) in enumerate(held.items(), 1):
        if not names:
            continue  # a selection that matches nothing updates nothing
        group = written.get(selection)
        own = {**base, **(group.settings if group else {})}
        found.append(
            GroupSettings(
                name="default" if group is None else f"group-{index}",
                selection=selection,
                lr=own["lr"],
                betas=own.get("betas") if optimizer.rule == "adamw" else None,
                eps=own.get("eps") if optimizer.rule == "adamw" else None,
                weight_decay=float(own.get("weight-decay", 0.0)),
                momentum=own.get("momentum") if optimizer.rule == "sgd" else None,
                parameters=tuple(names),
            )
        )
    return tuple(found)


def graph_key(result: Evaluated) -> str:
    """The digest of the traced train objective and evaluation passes of a checked
    file: equal for two knob settings exactly when they trace the same programs."""
    import jax

    model: ModelSpec = result.value("model")
    run: RunSpec = result.run
    probe = CompiledRun(
        result.path,
        result,
        model,
        result.value("optimizer"),
        run,
        cadence_plan(steps=1, cadence=1, microbatches=1),
        (),
        "",
    )
    params = {
        n: jax.ShapeDtypeStruct(s, "float32")
        for n, s in model.parameter_shapes().items()
    }
    digest = hashlib.sha256(repr(model).encode())

    def train_loss(p: Any, batch: Any) -> Any:
        with training_mode(True):  # as the train program traces it
            return probe.objective(*probe.parts(p, batch, train=True))

    def eval_metrics(p: Any, batch: Any) -> Any:
        return probe.evaluate(*probe.parts(p, batch, train=False))

    loaders = [(train_loss, result.value("train-loader"))]
    loaders += [(eval_metrics, spec.loader) for _, spec, _ in result.evals]
    for fn, loader in loaders:
        with shapes_only():  # a check's trace: `:attention :cudnn` traces anywhere
            jaxpr = jax.make_jaxpr(fn)(params, loader.batch_shapes())
        digest.update(str(jaxpr).encode())
    return digest.hexdigest()[:16]


def compile_run(
    path: str, selection: Selection | None = None, *, steps: int | None = None
) -> CompiledRun:
    """Check the run file at `path` and compile it for the engine.

    Args:
        path: the run file.
        selection: the variant, sweep point and `--set` values.
        steps: replaces defrun's `:steps` (the cadence stays as defrun resolved it).

    Raises:
        RunfileError: any coded diagnostic `check` raises, E-RUN-001 for a
            precision the engine does not run.
    """
    from .check import check_file, evaluate_checked

    check_file(path, selection)
    result = evaluate_checked(path, selection)
    run: RunSpec = result.run
    if steps is not None:
        assert result.run_span is not None  # check_file found the defrun
        check_steps(steps, run.cadence, result.run_span, "--steps")
        run = RunSpec(steps, run.microbatches, run.cadence, run.precision, run.seed)
    if run.precision not in ("f32", "bf16"):
        raise fail(
            "E-RUN-001",
            f"`:precision :{run.precision}` does not run on the engine yet",
            result.run_span,
            "use :precision :f32 or :bf16 (bf16 compute, f32 master weights)",
        )
    model: ModelSpec = result.value("model")
    optimizer: OptimizerSpec = result.value("optimizer")
    plan = cadence_plan(
        steps=run.steps,
        cadence=min(run.cadence, run.steps),
        microbatches=run.microbatches,
    )
    graph = graph_key(result)
    compiled = CompiledRun(
        path, result, model, optimizer, run, plan, _groups(optimizer, model), graph
    )
    _TRACED.setdefault(graph, compiled)
    return compiled


def default_run_dir(path: str) -> str:
    """Where a run of the run file at `path` writes without `--run-dir`:
    `runs/<file name without .sx>`."""
    return os.path.join("runs", os.path.splitext(os.path.basename(path))[0])


def handle_keywords(compiled: CompiledRun, run_dir: str | None) -> dict[str, Any]:
    """The `jaxnitro.Nitro` keywords of a compiled run."""
    run = compiled.run
    return {
        "seed": run.seed,
        "accum": run.microbatches,
        "max_epochs": compiled.plan.epochs,
        "precision": run.precision,
        "run_dir": run_dir or default_run_dir(compiled.path),
        "log_every_n_steps": compiled.plan.cadence,
        # One checkpoint a cadence block, the latest kept: `evaluate` metrics are
        # the run file's own, so there is no agreed "best" to rank by.
        "checkpointer": nx.Checkpointer(keep=nx.Last(1)),
        # `metrics` reports the objective on a pass itself: the engine's eval loss
        # would make it the monitor, and a checkpointer ranking by it would miss
        # it at the blocks where no pass runs.
        "eval_loss": False,
    }


def experiment(compiled: CompiledRun) -> RunfileExperiment:
    """The engine experiment of a compiled run."""
    return RunfileExperiment(graph=compiled.graph, compiled=compiled)  # type: ignore[call-arg]
