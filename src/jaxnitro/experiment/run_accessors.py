"""`RunAccessors`: the run accessors of an experiment, with their defaults.

Each accessor (`seed`, `accum`, `max_epochs`, `logger`, `checkpointer`, ...) is a
method here that returns the default; `Experiment` inherits them, and a subclass
overrides one with a method or with a field of the same name, while a `Nitro` keyword
of that name beats both (`jaxnitro.run.accessors` resolves them once per
construction). `schedules` reads no field: a field of that name is refused at setup.

`logger()` and `checkpointer()` return `RUN_DEFAULT`: their default objects are
classes of layers above the experiment, which the run makes (`jaxnitro.run.defaults`).
"""

from __future__ import annotations

import os
from typing import Any

# The train line's default thinning: Lightning's default (the spec says 1).
DEFAULT_LOG_EVERY_N_STEPS = 50


class _RunDefault:
    """The type of `RUN_DEFAULT`: one instance, compared by identity."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "RUN_DEFAULT"


# What `logger()` and `checkpointer()` return when the experiment keeps the base's:
# "the run's default". The classes live in layers above the experiment (logging/,
# checkpoint/), so the run makes them (`jaxnitro.run.defaults`).
RUN_DEFAULT: Any = _RunDefault()


class RunAccessors:
    """The run accessors' defaults; a keyword beats a subclass method or field,
    which beats these. `Experiment` inherits them."""

    def seed(self) -> int:
        """The global RNG seed, set before build_data.

        Setup seeds Python's `random` and NumPy's global RNG with it (NumPy's modulo
        2**32) before `build_data`, and passes `jax.random.key(seed)` to
        `build_model`. A resume takes the record's seed instead. A `seed` field
        must not be GraphConst (setup refuses it), so a seed sweep shares one
        compiled program.

        Returns:
            int: 42.
        """
        return 42

    def run_dir(self) -> str:
        """The run's output directory: runs/<experiment class name>.

        Relative to the working directory. Checkpoints, the manifest, the default
        log file and `resume="auto"` resolve against it.

        Returns:
            str: `os.path.join("runs", type(self).__name__)`.
        """
        return os.path.join("runs", type(self).__name__)

    def n_devs(self) -> int:
        """Local devices to shard the batch over (the global batch splits across
        them, so it must divide by n_devs); 1 runs on one device without a mesh.

        A `setup_devices(n_devs=...)` pin beats this accessor, and the `n_devs`
        keyword of `Nitro` beats both. At most the visible devices.

        Returns:
            int: 1.
        """
        return 1

    def accum(self) -> int:
        """Micro-batches per optimizer step; baked into the gradient program.

        Setup refuses a value that is not an int >= 1, and a train split whose
        batch count does not divide by it (`ConfigError`). With accum = N each
        optimizer step accumulates the gradients of N micro-batches.

        Returns:
            int: 1.
        """
        return 1

    def max_epochs(self) -> int:
        """Epochs to train for: the epoch `train()` ends at.

        Setup refuses a value that is not an int >= 0, and a `max_epochs` field
        marked GraphConst (`ConfigError`).

        Returns:
            int: 1.
        """
        return 1

    def max_steps(self) -> int | None:
        """Optimizer steps to train for in all, or None for no step bound.

        Counted over the whole run, a resume included: training ends after step
        `max_steps`, mid-epoch if it falls there (that part-epoch is validated,
        checkpointed and gets its history row; stop_reason "completed"), or at
        `max_epochs`, whichever comes first. When `max_epochs` is left at its
        default (no keyword, method or field sets it), max_steps alone bounds the
        run: setup sets max_epochs to the epochs it needs. The schedules' horizon
        is min(max_steps, max_epochs * steps per epoch). Setup refuses a value that
        is not an int >= 1.

        Returns:
            None.
        """
        return None

    def gradient_clip_norm(self) -> float:
        """Global-norm clip threshold of the accumulated gradient; 0 is off.

        Applied to the fully accumulated gradient at the start of the optimizer
        step. It must be finite and >= 0.

        Returns:
            float: 0.0.
        """
        return 0.0

    def check_divergence(self) -> bool:
        """Whether a non-finite training loss stops the run.

        When True, a NaN or infinite loss raises `DivergenceError` naming its step
        and epoch; when False, training continues from the diverged state.

        Returns:
            bool: True.
        """
        return True

    def log_every_n_steps(self) -> int:
        """Write the train line only on optimizer steps that are a multiple of this.

        Only the writing is thinned: the loss is still read back every micro-batch
        for the divergence check and the history, and validation and the per-epoch
        lines are unaffected. Setup refuses a value that is not an int >= 1.

        Whatever the cadence, every epoch (and the part of one a stop or max_steps
        cut) ends with a train summary line, context "train_epoch", at its last
        step: the epoch's mean loss (the history's `train_loss`) and each
        train_metrics value averaged over the epoch's optimizer steps (the mean of
        the values their train lines would carry; after a resume mid-epoch, over
        the steps trained since). A run shorter than this many steps still logs
        its training.

        The default, 50, departs from the spec's 1 (a train line on every optimizer
        step): a line every step cost a dispatch-bound step about 9%
        (benchmarks/logger_cost.py), so it is 50, as in PyTorch Lightning. Return 1
        (or pass `log_every_n_steps=1`) for a line every step.

        Returns:
            int: 50 (`DEFAULT_LOG_EVERY_N_STEPS`).
        """
        return DEFAULT_LOG_EVERY_N_STEPS

    def val_every_n_steps(self) -> int | None:
        """Validate also after every optimizer step that is a multiple of this.

        Such a validation runs mid-epoch, where the step falls (an epoch's last
        step validates at the epoch end, once); the epoch-end validation stays.
        Each one writes a validate line and updates every Plateau and the
        early-stopping policy, so their patience counts validations, not epochs;
        the history keeps one row per epoch. The validation a stop or max_steps
        adds mid-epoch counts only when its step is such a multiple, so a stopped
        and resumed run decides as a straight one. Setup refuses a value that is
        not an int >= 1, and one given without a val split.

        Returns:
            None: validate at epoch ends only.
        """
        return None

    def checkpoint_every_n_steps(self) -> int | None:
        """Write a checkpoint record also after every optimizer step that is a
        multiple of this.

        A record written mid-epoch holds where the epoch stands (its batches and
        running train loss), so a resume from it continues that epoch at the exact
        batch and reproduces a straight run bitwise. It carries the validation
        metrics of its step when a validation ran there, else none (a ranking
        selector leaves it unscored). The manifest keeps one record per epoch of a
        run, so a later record of the same epoch replaces it. Setup refuses a value
        that is not an int >= 1.

        Returns:
            None: checkpoint at epoch ends only.
        """
        return None

    def autolog_schedules(self) -> bool:
        """Whether varying schedule values are logged on the train line.

        Returns:
            bool: True.
        """
        return True

    def eval_loss(self) -> bool:
        """Whether evaluation also reports the loss when custom metrics are defined.

        When True, each eval batch also runs `loss` in its own compiled program, and
        `loss` and each `loss/<term>` join what `finalize_metrics` returns, averaged
        over batches; a split whose batches lack the fields `loss` declares is
        skipped. Without `metrics` the loss is reported anyway.

        Returns:
            bool: False.
        """
        return False

    def monitor(self) -> tuple[str, str] | None:
        """The validation metric the run is judged by, as (name, "min" | "max").

        The checkpointer, early stopping and every Plateau follow it unless given
        their own metric and mode. The name is a key of the validation metrics
        (the validation loss is "loss"); "val_loss" is read as "loss" with a
        `DeprecationWarning`. None becomes ("loss", "min") at setup when the
        experiment defines no `metrics` or `eval_loss` is on. Otherwise there is no
        monitor, and setup refuses what would follow it: a checkpointer without a
        metric of its own that keeps Best checkpoints (on a handle with a val
        split), an EarlyStopping or a Plateau without their own metric.

        Returns:
            tuple[str, str] | None: None.
        """
        return None

    def logger(self) -> Any:
        """The run's logger; the default writes metrics.jsonl in run_dir.

        Called once per construction (not at all when the `logger` keyword is
        given), so a side effect in an override happens once per `Nitro`. Return
        None to log nothing.

        Returns:
            RUN_DEFAULT: the run's default, which setup makes
            (`jaxnitro.run.defaults`): a new `JSONLogger` pointed at
            `<run_dir>/metrics.jsonl`. An override may return `super().logger()`
            for the same.
        """
        return RUN_DEFAULT

    def checkpointer(self) -> Any:
        """The run's checkpointer; the default keeps the best 3 and the latest.

        Called once per construction (not at all when the `checkpointer` keyword
        is given). Return None to write no checkpoints.

        Returns:
            RUN_DEFAULT: the run's default, which setup makes
            (`jaxnitro.run.defaults`): a new `Checkpointer()`,
            `keep=(Best(3), Last(1))`, ranking by the monitor.
        """
        return RUN_DEFAULT

    def early_stop(self) -> Any:
        """The early-stopping rule; default none.

        An `EarlyStopping`, or any object with `should_stop(epoch, metrics) ->
        bool`, checked once per epoch after validation; setup refuses one on a
        handle that has a train split and no val split.

        Returns:
            None: the run never stops early.
        """
        return None

    def ema(self) -> Any:
        """The exponential moving average of the weights; default none.

        Return an `EMA(beta)` to keep one; validation, checkpoint selection and
        `predict` then read it (see the `eval_weights` keyword).

        Returns:
            None: no EMA.
        """
        return None

    def schedules(self) -> dict[str, Any]:
        """Values that vary with the optimizer step; default none.

        Each entry maps a key (an optimizer rule field such as "learning_rate", a
        Device field, a gradient rule field) to a factory of the horizon (called
        once with `total = max_epochs * (len(train) // accum)`, returning `step ->
        value`), a schedule, a bare number or a `Plateau`. It reads no field of the
        experiment: a field named `schedules` is refused.

        Returns:
            dict[str, Any]: an empty dict.
        """
        return {}
