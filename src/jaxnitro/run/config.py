"""`RunConfig`: a run's settings as one frozen, typed value, validated when built.

`RunConfig.resolve(experiment, keywords)` resolves every run keyword the way
`run.accessors` does (the keyword, else the experiment's method or field of that name,
else the default on `Experiment`), converts each value to its field's type and refuses
a bad one, naming the field, the value, where it came from and the fix, before setup
does any long work. `sources` says where each value came from, for the binding report
and the stale-handle check. A setup step that changes a value (a resume adopts the
recorded seed; the monitor defaults to ("loss", "min")) takes a new config from
`with_value`; nothing mutates one.

Two construction keywords are not fields. `data` is the collection of splits the run
reads: the handle holds it as `nitro.data` (live sources that training releases).
`run_ref` is a callback that receives the finished handle. Neither is a setting that
a report shows or a later step reads.

A value already of its field's type is kept as given, so the binding report shows what
was passed; another (a NumPy integer, a `Path` run_dir, 1 for a flag) is converted as
the run always read it (`int`, `float`, `str`, `bool`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal

from ..checkpoint.checkpointer import Checkpointer
from ..devices.process import pinned_n_devs
from ..errors import ConfigError
from ..loop.accumulation import Accumulation
from ..optim.ema import EMA
from .accessors import (
    ACCESSOR_KEYWORDS,
    NOT_PASSED,
    PLAIN_KEYWORDS,
    SOURCES,
    Source,
    resolve,
)
from .defaults import run_default
from .setting_checks import SETTING_CHECKS
from .smoke import smoke_checkpointer, smoke_logger, smoke_requested, smoke_run_dir

# Accessors that construct an object: called once, after the settings are checked,
# so a refused configuration constructs no logger (which may open a run somewhere).
CONSTRUCTED = ("logger", "checkpointer")
_VALUE_ACCESSORS = tuple(n for n in ACCESSOR_KEYWORDS if n not in CONSTRUCTED)
# The binding report's rows, in its order: the settings, then what they constructed.
REPORTED = _VALUE_ACCESSORS + CONSTRUCTED
# Construction facts, not settings (see the module docstring).
NOT_FIELDS = ("data", "run_ref")
# A plain keyword's value when it is not passed; eval_weights follows the EMA.
_PLAIN_DEFAULTS: dict[str, Any] = {
    "weights": None,
    "resume": False,
    "w0": None,
    "restore_optimizer": False,
    "resume_changed_data": False,
    "restore_best": False,
    "eval_weights": None,
    "load_ema": False,
    "compile_options": None,
    "sharding": "replicated",
    "preset": None,
    "profile": None,
    "precision": "f32",
    "smoke": None,  # read by smoke_requested: the keyword, else NITRO_SMOKE
    "steps_per_call": "auto",
}

EVAL_WEIGHTS_VALUES = 'eval_weights={value!r}: it is "ema" or "raw".'
EVAL_WEIGHTS_NEEDS_EMA = (
    'eval_weights="ema" needs an EMA of the weights: set ema() on the experiment or '
    "pass ema=EMA(beta)."
)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RunConfig:
    """The settings of one run, fixed when its `Nitro` is built (`nitro.config`): the
    reference of every `Nitro(...)` keyword.

    One field per run keyword. Those marked "accessor" resolve through the
    experiment: the keyword, else the experiment's method or field of the same name,
    else the `Experiment` default given here; passing the keyword replaces that value
    for this run, and `sources` says which one bound. The others are the keyword or
    their default. Built by `RunConfig.resolve`, which checks every value (a bad one
    raises `ConfigError` naming it and where it came from) before setup does any long
    work; frozen, so a changed value is a new config from `with_value`.

    Three construction keywords are no setting, so no field:

    - `data` (`Mapping[str, Any]`): the split collection, `{name: source}`, used in
      place of `build_data`, which then does not run. The handle holds it as
      `nitro.data`.
    - `run_ref` (`list | Callable[[Nitro], Any]`): receives the handle when
      construction finishes: a list has it appended, a callable is called with it.
    - `checkpoint`: the deprecated spelling of `weights=`; it warns.

    Attributes:
        seed: the global seed (accessor, default 42). Python's `random` and NumPy's
            global RNG are seeded with it before `build_data`, and `build_model`
            receives `jax.random.key(seed)`. A resume adopts the record's seed
            instead (source "record"), and warns when the one given differs.
        run_dir: where checkpoints, the manifest and the default log file go
            (accessor, default `runs/<experiment class name>`).
        n_devs: devices to shard the batch over: the keyword, else the pin of
            `setup_devices(n_devs=...)`, else the accessor, else 1 (one device, no
            mesh). Above 1 the run builds a data-parallel mesh over the first n_devs
            visible devices: the batch (global; it must divide by n_devs) is split
            along its first axis, the training state laid out as `sharding` says.
        accum: micro-batches per optimizer step, >= 1 (accessor, default 1). The
            train split's batch count must divide by it.
        max_epochs: the epoch training ends at, >= 0 (accessor, default 1); a
            resumed handle continues from its recorded epoch up to it. Left at its
            default beside `max_steps`, setup replaces it with the epochs max_steps
            needs, ceil(max_steps / optimizer steps per epoch), source "max_steps".
        max_steps: optimizer steps to train for in all, >= 1, counted over the
            whole run, a resume included (accessor, default None: no step bound).
            Training ends after that step, mid-epoch too, or at max_epochs,
            whichever comes first; the schedules' horizon is the smaller of the two.
        schedules: step-varying values, `{key: factory}` (accessor, default none);
            the keyword replaces the accessor's table whole. Held as given: binding
            it to its targets needs the parameters, so the optimizer plan checks it.
        gradient_clip_norm: the global-norm clip of the accumulated gradient; 0 is
            off (accessor, default 0.0).
        check_divergence: whether a non-finite training loss raises
            `DivergenceError` (accessor, default True).
        autolog_schedules: whether varying schedule values go on the train line
            (accessor, default True).
        log_every_n_steps: write the train line only on optimizer steps that are a
            multiple of this, >= 1 (accessor, default 50; the spec's is 1).
        val_every_n_steps: also validate after each optimizer step that is a
            multiple of this (>= 1), mid-epoch (accessor, default None: at epoch
            ends only). Needs a val split.
        checkpoint_every_n_steps: also write a checkpoint record after each
            optimizer step that is a multiple of this (>= 1), mid-epoch (accessor,
            default None: at epoch ends only); a resume from one continues the
            epoch exactly, at its batch.
        logger: the run's logger object, or None to log nothing (accessor, default
            a `JSONLogger` writing `metrics.jsonl` in run_dir).
        checkpointer: the run's `Checkpointer`, or None to write no checkpoints
            (accessor, default `Checkpointer()`: the best 3 and the latest).
        early_stop: an `EarlyStopping`, an object with `should_stop(epoch,
            metrics)`, or None for none (accessor, default None). Needs a val split.
        monitor: the validation metric the run is judged by, `(name, "min" |
            "max")` (accessor, default None). Left at None, setup fills `("loss",
            "min")` when the loss is sure to exist: the experiment defines no
            `metrics`, or `eval_loss` is on. The checkpointer, early stopping and
            every Plateau follow it unless given their own.
        eval_loss: with custom `metrics`, whether validation and evaluation also
            report the loss and its terms (accessor, default False).
        ema: an exponential moving average of the weights (`EMA`), or None
            (accessor, default None).
        weights: where the starting parameters and model state come from (default
            None: `build_model`'s): a record path; a `(run, which)` pair resolved
            through the manifest (`run` a run id, "latest", "all" with "best", or a
            `Nitro`; `which` "best", "latest", `Average(selector)`, or "current"
            with a `Nitro`); or another `Nitro` (a warm start through host memory,
            leaf for leaf). No step, epoch or optimizer state is taken.
        resume: continue a run exactly (weights, state, optimizer state, EMA, step,
            epoch, counters): False (the default), "auto" (the newest record of the
            newest run; a directory with none starts fresh, with a warning), a
            record path, or a `(run, which)` pair.
        w0: what `decay_anchor="w0"` anchors to: "build_model" (the parameters
            `build_model` returned; None, the default, means it), "weights" (those a
            `weights=` source loaded), or a parameter tree shaped like the
            parameters.
        restore_optimizer: with `weights=` a checkpoint record, also restore its
            optimizer state; step, epoch and schedules still start fresh (default
            False).
        resume_changed_data: let a resume go on, with a warning, when the train
            data changed shape against its record (the train or val split size, the
            batch size, a train field's per-sample shape or dtype), which is refused
            by default, naming each change (default False).
        restore_best: True loads the run's own best checkpoint, `Average(selector)`
            the average of its checkpoints that the selector picks, when a `train()`
            that did not fail ends (default False). Needs a train split and a
            checkpointer.
        eval_weights: the weights validation, checkpoint selection and `predict`
            read: "ema" (the default with an EMA) or "raw" (the default without).
        load_ema: load the `weights=` source's EMA in place of its weights (default
            False).
        compile_options: XLA compiler options, `{name: bool | int | float | str}`,
            for every program the handle compiles, checked at construction by
            compiling a trivial program with them (default none).
        sharding: how a mesh run (n_devs > 1) lays out the parameters, optimizer
            state, EMA and accumulator: "replicated" (the default; every device
            holds them whole) or "fsdp" (each leaf of at least 1024 elements split
            along its largest dimension that divides by n_devs, so a device holds
            about 1/n_devs of the model; `memory_report()` shows it).
        preset: the named preset this run was built from, recorded in the logs and
            checkpoints: the preset form `Nitro(E, "name")` sets it; in the
            instance form the keyword names the recipe to record, which must be a
            preset of the experiment's class (default None).
        profile: `(first_step, n_steps)`: write a `jax.profiler` trace of those
            optimizer steps (1-based, over the whole run) into
            `<run_dir>/profile/`, for TensorBoard's profile plugin or Perfetto.
            None (the default) profiles nothing.
        precision: "f32" (the default) or "bf16": forward and backward in bfloat16,
            with float32 master weights, optimizer state and loss reduction
            (`jaxnitro.compile.precision`); part of every program's compile-cache
            key. Manual mode refuses "bf16" (cast in `train_step`).
        smoke: whether this is a smoke run (`jaxnitro.run.smoke`): one epoch on the
            first two batches of every split, with validation and one checkpoint,
            in a temporary directory. The keyword, else the `NITRO_SMOKE`
            environment variable (default off).
        steps_per_call: optimizer steps the automatic loop runs per dispatched
            call, an int >= 1, or "auto" (the first epoch one step per call, then
            the count its measured step time picks); on a CPU any count trains the
            same parameters bit for bit as 1. Default "auto" (on a CPU as on an
            accelerator: it measured faster or as fast there, 2026-12-06); the
            guide "Performance on accelerators" tells the rest.
        sources: where each field's value came from: "keyword", "pin"
            (`setup_devices(n_devs=...)`), "method", "field",
            "default", "record" (what a resume adopted from the record), "smoke"
            (what a smoke run set), "environment" (`NITRO_SMOKE`) or "max_steps"
            (max_epochs, left at its default, following max_steps).

    Examples:
        >>> from jaxnitro import Experiment
        >>> class E(Experiment):
        ...     max_epochs: int = 3
        ...     def accum(self):
        ...         return 2
        >>> config = RunConfig.resolve(E(), {"seed": 7, "logger": None})
        >>> config.seed, config.accum, config.max_epochs, config.n_devs
        (7, 2, 3, 1)
        >>> [config.sources[n] for n in ("seed", "accum", "max_epochs", "n_devs")]
        ['keyword', 'method', 'field', 'default']
        >>> config.with_value("seed", 5, source="record").sources["seed"]
        'record'
    """

    seed: int
    run_dir: str
    n_devs: int
    accum: int
    max_epochs: int
    max_steps: int | None
    schedules: Any
    gradient_clip_norm: float
    check_divergence: bool
    autolog_schedules: bool
    log_every_n_steps: int
    val_every_n_steps: int | None
    checkpoint_every_n_steps: int | None
    logger: Any
    checkpointer: Checkpointer | None
    early_stop: Any
    monitor: tuple[str, str] | None
    eval_loss: bool
    ema: EMA | None
    weights: Any
    resume: Any
    w0: Any
    restore_optimizer: bool
    resume_changed_data: bool
    restore_best: Any
    eval_weights: Literal["ema", "raw"]
    load_ema: bool
    compile_options: Mapping[str, bool | int | float | str]
    sharding: Literal["replicated", "fsdp"]
    preset: str | None
    profile: tuple[int, int] | None
    precision: str
    smoke: bool
    steps_per_call: int | Literal["auto"] = "auto"
    sources: Mapping[str, Source]

    def __post_init__(self) -> None:
        names = SETTINGS
        unsourced = [n for n in names if n not in self.sources]
        unknown = [n for n in self.sources if n not in names]
        odd = {n: s for n, s in self.sources.items() if s not in SOURCES}
        if unsourced or unknown or odd:
            raise ValueError(
                f"RunConfig.sources must name every setting, each with one of "
                f"{', '.join(SOURCES)}; without a source: {unsourced}, not settings: "
                f"{unknown}, unknown sources: {odd}. Build it with RunConfig.resolve."
            )
        for name, check in SETTING_CHECKS.items():
            value = check(getattr(self, name), self.sources[name])
            object.__setattr__(self, name, value)
        if self.eval_weights not in ("ema", "raw"):
            raise ConfigError(EVAL_WEIGHTS_VALUES.format(value=self.eval_weights))
        if self.eval_weights == "ema" and self.ema is None:
            raise ConfigError(EVAL_WEIGHTS_NEEDS_EMA)
        object.__setattr__(self, "sources", MappingProxyType(dict(self.sources)))

    @classmethod
    def resolve(cls, experiment: Any, keywords: Mapping[str, Any]) -> RunConfig:
        """The config of `Nitro(experiment, **keywords)`, every value checked.

        Each accessor is called once. The settings are checked before the logger and
        checkpointer accessors run; a bad value raises a ConfigError naming it.
        """
        values, sources = _checked_settings(experiment, keywords)
        values["smoke"], sources["smoke"] = smoke_requested(keywords)
        if values["smoke"]:
            values["max_epochs"], values["run_dir"] = 1, smoke_run_dir()
            sources["max_epochs"] = sources["run_dir"] = "smoke"
        for name in CONSTRUCTED:
            if values["smoke"] and keywords.get(name, NOT_PASSED) is not None:
                # Never the experiment's own: a tracking logger may open a run.
                made = smoke_logger() if name == "logger" else smoke_checkpointer()
                values[name], sources[name] = made, "smoke"
                continue
            found = resolve(experiment, name, keywords)
            values[name] = run_default(name, found.value)
            sources[name] = found.source
        for name in PLAIN_KEYWORDS:
            if name in NOT_FIELDS or name == "smoke":
                continue
            given = keywords.get(name)
            passed = given is not None  # None asks for the default, as not passing
            values[name] = given if passed else _PLAIN_DEFAULTS[name]
            sources[name] = "keyword" if passed else "default"
        if values["eval_weights"] is None:  # the EMA, checked above, decides
            values["eval_weights"] = "ema" if values["ema"] is not None else "raw"
        return cls(**values, sources=sources)

    @property
    def accumulation(self) -> Accumulation:
        """`accum` as an `Accumulation`: the steps an epoch makes, the samples a
        step takes, the refusals of a batch count it does not divide."""
        return Accumulation(self.accum)

    def with_value(self, name: str, value: Any, *, source: Source) -> RunConfig:
        """This config with `name` set to `value`, from `source`, checked as built.

        Raises:
            AttributeError: `name` is not a setting of RunConfig.
        """
        if name not in SETTINGS:
            raise AttributeError(
                f"RunConfig has no setting {name!r}; its settings are: "
                f"{', '.join(SETTINGS)}."
            )
        return dataclasses.replace(
            self, **{name: value}, sources={**self.sources, name: source}
        )

    def reported(self) -> dict[str, tuple[Any, Source]]:
        """The accessor settings as the binding report lists them: name -> (value,
        source), in the report's order."""
        return {name: (getattr(self, name), self.sources[name]) for name in REPORTED}


def _checked_settings(
    experiment: Any, keywords: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, Source]]:
    """The value accessors resolved (keyword, pin, method, field, default) and
    checked, with their sources; each accessor is called once."""
    values: dict[str, Any] = {}
    sources: dict[str, Source] = {}
    for name in _VALUE_ACCESSORS:
        found = resolve(experiment, name, keywords)
        values[name], sources[name] = found.value, found.source
    pin = pinned_n_devs()
    if pin is not None and sources["n_devs"] != "keyword":
        values["n_devs"], sources["n_devs"] = pin, "pin"
    for name, check in SETTING_CHECKS.items():
        if name in values:
            values[name] = check(values[name], sources[name])
    return values, sources


def check_settings(experiment: Any, keywords: Mapping[str, Any]) -> None:
    """Check what `Nitro(experiment, **keywords)` would check of its settings first,
    without building anything: every value accessor (the keyword, else the
    experiment's method or field, else the default) and every plain keyword with a
    check of its own (`precision`, `sharding`, ...). Constructs no logger or
    checkpointer.

    Raises:
        ConfigError: a value its setting refuses, named with where it came from.
    """
    _checked_settings(experiment, keywords)
    for name, value in keywords.items():
        if name in PLAIN_KEYWORDS and name in SETTING_CHECKS and value is not None:
            SETTING_CHECKS[name](value, "keyword")


# The fields of RunConfig that hold a setting: all but `sources`.
SETTINGS = tuple(f.name for f in dataclasses.fields(RunConfig) if f.name != "sources")
