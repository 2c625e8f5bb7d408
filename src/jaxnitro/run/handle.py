"""`Nitro`: the handle of one run. Constructing it runs setup and nothing else; the
verbs (`train`, `validate`, `evaluate`, `predict`, `render`, `set_device`, ...) act on
it, and its read side (the properties and reports) is `run.view.RunView`.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator
from typing import Any

from ..errors import ConfigError
from ..handle_type import RunHandle
from ..loop.evaluate import evaluate_split, predict_batch
from ..observe.entry import entry_point
from ..observe.progress import Progress
from ..observe.transitions import PhaseRecorder
from . import refusals, rendering, reports, restore
from .arguments import constructor_arguments, fill_ref
from .device_fields import device_updates
from .entry_call import run_entry
from .parts import RunParts
from .refusals import is_one_batch, refuse_missing_split, refuse_predict_input
from .setup import run_setup
from .setup_parts import SetupOutcome
from .smoke import remove_smoke_run_dir
from .status import EpochEndHook, RunStatus
from .training import run_training
from .view import RunView


class Nitro(RunView):
    """The state of one run: model, weights, optimizer, data and counters.

    `Nitro(e, **kw)` runs the setup sequence and nothing else: it resolves the run
    keywords and accessors (the logger and checkpointer accessors are called exactly
    once), freezes the hooks, locates a checkpoint to resume or load, seeds, builds
    the data (or takes `data=`), derives, places the Device fields on the device,
    probes one batch for routing and the split checks, builds the model, restores
    weights, and logs the parameters and the binding report. Nothing is compiled
    and no optimizer state is allocated until a verb needs it, so `train`,
    `validate`, `evaluate`, `predict` and `render` all work on the handle, trained
    or not. `Nitro(E, "preset", **kw)` builds the experiment from a named preset of
    class `E`: run keywords go to the handle, field names to the recipe, a name that
    is both is the run keyword, and the preset name is logged and stored in the
    checkpoints.

    Every run keyword (`seed`, `run_dir`, `accum`, `max_epochs`, `logger`,
    `checkpointer`, `weights`, `resume`, ...) is documented once, with its default
    and the accessor it falls back to, as a field of
    [`RunConfig`][jaxnitro.run.RunConfig] (the handle's `config`), beside `data`,
    `run_ref` and the deprecated `checkpoint`.

    Args:
        experiment: an `Experiment` instance; in the preset form, an `Experiment`
            subclass.
        preset: the preset name (positional), in the class form only.
        **kwargs: the run keywords, each a field of `RunConfig` (or `data`,
            `run_ref`, `checkpoint`); any other name raises `ConfigError`.

    Attributes:
        data (dict[str, Any]): the splits, each wrapped in its prefetch settings (a
            `PrefetchIterator` at the defaults unless it was already one or a
            `NoPrefetch`); `len()` and `iter()` pass through to the source.

    Raises:
        ConfigError: an unknown keyword, or `checkpoint=` beside `weights=`; a
            misused preset form; accum, max_epochs, max_steps or a `*_every_n_steps`
            count not an int in range; val_every_n_steps without a val split; a
            malformed monitor, compile option, `w0`, `eval_weights`,
            `restore_best` or `run_ref`; a checkpointer that is not a
            `Checkpointer`; `resume=` beside `weights=`, or `restore_optimizer` /
            `load_ema` without what they need; `early_stop` or a Plateau without a
            val split; seed or max_epochs marked GraphConst; a train split whose
            batch count does not divide by accum, that keeps a partial last batch,
            or whose batch fields a traced hook reads are not numeric; a
            checkpointer that keeps Best checkpoints with nothing to rank by; a
            resume whose record has other GraphConst values or decay anchors, or
            was logged by another logger type.
        HookError: a required hook (`build_model`, `build_data`, `forward`, `loss`)
            is missing, or `build_data`, `derive` or `build_model` returned the
            wrong kind of value.
        RoutingError: a probed batch lacks a field `forward`, `loss` or
            `train_metrics` declares.
        CheckpointError: a `resume=` or `weights=` source cannot be found or read,
            or its trees do not match this model leaf for leaf; a resume whose
            train data changed shape against its record (without
            `resume_changed_data=True`).
        NotYetSupportedError: a `train_step` or `setup_optimizers` hook,
            `resume=` from a live handle, or a process that is one of several
            `jax.distributed` processes.

    Warns:
        NitroWarning: a resume whose recorded seed differs, whose hooks' code
            changed, or whose data changed with `resume_changed_data=True`;
            `resume="auto"` with nothing to resume; a `weights=` record written
            with other GraphConst values, or lacking a value `derive` produced; a
            checkpointer whose retention can lose epochs or other runs' files, or
            that meets entries scored under another metric.
        DeprecationWarning: `checkpoint=`; the monitor name "val_loss".

    Examples:
        A tiny regression (the getting-started guide shows a fuller run):

        >>> import jax.numpy as jnp
        >>> import numpy as np
        >>> import jaxnitro as nx
        >>> class DocFit(nx.Experiment):
        ...     def build_data(self, dist):
        ...         x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8, 1)
        ...         return {"train": [{"x": b, "y": 3 * b} for b in x]}
        ...
        ...     def build_model(self, rng):
        ...         return None, {"w": jnp.zeros((1, 1))}, {}
        ...
        ...     def forward(self, model, params, state, *, x):
        ...         return x @ params["w"], state
        ...
        ...     def loss(self, pred, *, y):
        ...         return jnp.mean((pred - y) ** 2)
        >>> nitro = nx.Nitro(DocFit(), logger=None, checkpointer=None)  # writes nothing
        >>> nitro.current_epoch, nitro.phase  # setup only: nothing compiled yet
        (0, Starting())
        >>> nitro.train().stop_reason, nitro.current_epoch, nitro.current_step
        ('completed', 1, 4)
        >>> nitro.predict({"x": np.ones((3, 1), np.float32)}).shape  # padded to 8
        (3, 1)
    """

    def __init__(
        self, experiment: Any, preset: str | None = None, /, **kwargs: Any
    ) -> None:
        experiment, kwargs = constructor_arguments(experiment, preset, kwargs)
        self.phase_recorder = PhaseRecorder(self)
        self._parts: RunParts | None = None  # what setup returns, once it finished
        with entry_point() as entry, Progress() as progress:
            progress.begin("setup")
            self._adopt(run_setup(experiment, kwargs, progress))
            self._setup_lines_pending = reports.begin_setup_lines(
                self, self._run.evaluation.eval_width, lock_held=self._run.lock.held
            )
            entry.attach(self)
        run_ref = kwargs.get("run_ref")
        if run_ref is not None:
            fill_ref(run_ref, self)

    def _adopt(self, outcome: SetupOutcome) -> None:
        """Hold what setup produced: the handle is a facade over its parts."""
        parts = RunParts.build(outcome, self.phase_recorder)
        self._parts = parts
        # A handle dropped (garbage collected) lets go of its run directory's lock,
        # and a smoke run's temporary directory goes with it.
        if outcome.config.smoke:
            weakref.finalize(
                self, remove_smoke_run_dir, parts.lock, outcome.config.run_dir
            )
        else:
            weakref.finalize(self, parts.lock.release)
        self.data: dict[str, Any] = parts.data
        self.executables = parts.executables
        self.status: RunStatus = parts.status

    def log_setup(self) -> None:
        """Log the parameters (before any compile) and show the binding report."""
        self._setup_lines_pending = False
        reports.log_setup(self, self._run.evaluation.eval_width)

    def _log_setup_lines(self) -> None:
        """The deferred setup lines, once (`reports.begin_setup_lines`)."""
        if self._setup_lines_pending:
            self._setup_lines_pending = False
            reports.log_setup_lines(self, self._run.evaluation.eval_width)

    def _train_locked(self) -> None:
        """train()'s work: the run directory's lock first (a refusal writes
        nothing), then the deferred setup lines, then the training, which lets
        go of the lock when it returns or raises."""
        lock = self._run.lock
        if self._setup_lines_pending and not lock.held:
            lock.take(self.config.checkpointer, self.config.run_dir, purpose="train")
            try:
                self._log_setup_lines()
            except BaseException:
                lock.release()
                raise
        run_training(self, self._run)

    def train(self, **kwargs: Any) -> Nitro:
        """Train from the current epoch up to max_epochs, or until a stop.

        Each epoch runs the train split's micro-batches (the first call compiles the
        training programs, or takes them from the compile cache), then validates on
        the val split when there is one, updates every Plateau and the
        early-stopping policy, appends one `history` row, logs the validate line,
        and writes a checkpoint if the checkpointer keeps the epoch. Training ends
        at max_epochs ("completed"), at an early stop ("early_stop"), at a
        `request_stop()` or Ctrl+C honoured at the next step boundary, after which
        the epoch still validates and checkpoints ("requested"; a SIGTERM does the
        same, "preempted", then raises `Preempted`), or by raising ("error");
        `stop_reason` says which. An epoch a stop cut short is finished first by
        the next `train()`. At the end the last record written gets the
        stop reason if a selector kept that epoch (on an error too), a
        `restore_best` handle loads its selected checkpoint (unless training
        raised), the logger is finished, and the handle goes to `Done` (`Failed`
        when it raised), which releases the data sources. While it runs it holds the
        lock of the directory its checkpointer writes; the guide "Checkpoints and
        resume" says when the lock is taken and let go, and what another process
        meets.

        Args:
            **kwargs: none is accepted: every run setting belongs to the
                constructor and was fixed there. To train further, build a new
                handle: `Nitro(e, resume="auto", max_epochs=N)`.

        Returns:
            This handle, so `Nitro(e).train()` chains.

        Raises:
            ConfigError: any keyword; a handle that ended its last `train()` holding
                its `restore_best` weights; a checkpointer directory setup could
                not write; a released split; no train split; a
                train batch of another size mid-epoch; an epoch whose batch count
                does not divide by accum, or that delivers other than `len()`
                batches; a validation metric named like a history column (epoch,
                step, train_loss, seconds); a monitor, early-stopping or Plateau
                metric that validation did not return.
            DivergenceError: a non-finite training loss under check_divergence,
                naming its step and epoch. There is no rollback: resume from the
                last checkpoint.
            CheckpointError: the optimizer state of the resumed (or
                `restore_optimizer`) record does not match this run's optimizer;
                the checkpointer's own metric is missing from the validation
                metrics; a metric the checkpointer, early stopping or a Plateau
                branches on is not a finite real number.
            HookError: a hook returned the wrong thing (`forward` not `(outputs,
                state)`, a non-scalar loss, a forward output leaf without the batch
                axis first, ...).
            RoutingError: a batch lacks a field a hook declares.
            StrippedHostError: traced code read a Host field.
            RunDirLockedError: another process is writing the checkpointer's
                directory (its lock names the pid and host), raised before any
                step.
            Preempted: a SIGTERM stopped training (stop_reason "preempted") after
                the epoch validated, checkpointed and the logger finished; it is a
                `SystemExit` with status 143, so an uncaught one ends the process
                without a traceback.

        Warns:
            NitroWarning: nothing to train (the handle is already at max_epochs);
                `restore_best` found nothing to load and keeps the final weights.
            StaleHandleWarning: a scalar accessor or a hook was redefined after the
                handle was built; the handle keeps what it froze.

        Example::

            nitro = Nitro(MyExp(), run_dir="runs/demo")   # setup only
            nitro.train()                                 # epochs 1..max_epochs
            nitro.stop_reason                             # "completed", ...
            Nitro(MyExp(), run_dir="runs/demo", resume="auto", max_epochs=40).train()
        """
        refusals.refuse_train_keywords(kwargs)
        reports.check_stale(self, "train")
        if self.prepared.unwritable is not None:  # setup's probe could not write
            raise ConfigError(self.prepared.unwritable)
        restore.refuse_after_restore_best(self._run.values)
        self._run.splits.refuse_released("train()", ("train", "val"))
        self._run_entry(self._train_locked, setup_lines=False)
        return self

    def validate(self) -> dict[str, Any]:
        """Run the val split in eval mode and return its finalized metrics.

        The pass the training loop runs after each epoch, on a handle trained or
        not. It shares one compiled eval forward with `evaluate` and `predict`
        (compiled on first use for the eval batch width), so moving between them
        compiles nothing. A short batch is padded to the width and every output
        leaf sliced back to the real sample count before `metrics` sees it.
        `request_stop()` or Ctrl+C ends the pass between source batches, and the
        metrics then cover the batches that ran.

        Returns:
            dict[str, Any]: metric name to value. Without a `metrics` hook,
            `{"loss": ...}` and a `"loss/<term>"` entry per term `loss` returns,
            each the mean over batches. With one, what `finalize_metrics` returns
            (by default each metric combined across batches as its mode says),
            plus those loss entries when `eval_loss` is on. A 0-d value is a Python
            number; a non-scalar one (a summed confusion matrix) is a NumPy array.
            When forward's outputs held NaN or infinite values (in the real rows,
            never the padding), `"nonfinite_outputs"` is their count and the metrics
            stand as computed; a clean pass has no such key.

        Raises:
            ConfigError: the data has no val split, or its source was released;
                a batch whose fields disagree on the batch size.
            RoutingError: a batch lacks a field `forward` or `metrics` declares
                (or `loss`, when the loss is the metric).
            HookError: `forward` did not return `(outputs, state)`, or an output
                leaf lacks the batch axis first; `finalize_metrics` returned a
                non-dict, or a "concat" metric unreduced; a metric key collides
                with an `eval_loss` key, or is `nonfinite_outputs`.
            StrippedHostError: traced code read a Host field.

        Warns:
            NitroWarning: a scalar metric is NaN or infinite, or forward's outputs
                held NaN or infinite values (once per pass, with the count); in
                training such an epoch's record is unscored, and early stopping
                and Plateau count it as no improvement.
            StaleHandleWarning: a hook, or the seed or run_dir accessor, was
                redefined after the handle was built; the handle keeps what it
                froze.
        """
        reports.check_stale(self, "validate")
        refuse_missing_split(self.data, "val")
        self._run.splits.refuse_released("validate()", ("val",))
        return self._run_entry(lambda: evaluate_split(self._run.evaluation, "val"))

    def evaluate(self, split: str = "test") -> dict[str, Any]:
        """Run any named split in eval mode and return its finalized metrics.

        The same pass as `validate`, on the split named, sharing its compiled eval
        forward (and device metrics program) with `validate` and `predict`.
        `request_stop()` or Ctrl+C ends the pass between source batches.

        Args:
            split: the name of a split of the data collection (default "test").

        Returns:
            dict[str, Any]: metric name to value, as `validate` returns them;
            `finalize_metrics` receives `split` as its third argument.

        Raises:
            ConfigError: the data has no split of that name (the message lists the
                splits); else as for `validate`.
            RoutingError, HookError, StrippedHostError: as for `validate`.

        Warns:
            NitroWarning, StaleHandleWarning: as for `validate`.

        Example::

            nitro.evaluate()                 # the "test" split: {"acc": 0.97, ...}
            nitro.evaluate(split="val")      # the same as nitro.validate()
        """
        reports.check_stale(self, "evaluate")
        refuse_missing_split(self.data, split)
        self._run.splits.refuse_released(f"evaluate(split={split!r})", (split,))
        return self._run_entry(lambda: evaluate_split(self._run.evaluation, split))

    def predict(self, batch: Any) -> Any:
        """Forward alone, in eval mode, on a batch dict or an iterable of them.

        Only the fields `forward` declares are read, so a prediction batch needs no
        labels. A batch narrower than the eval batch width is padded to it (its
        last sample repeated) and every output leaf sliced back; a wider one runs
        in chunks of the width, joined again along the batch axis. The program is
        the eval forward that `validate` and `evaluate` use, so once it is
        compiled, `predict` compiles nothing for batches of the same per-sample
        shapes and dtypes, whatever their values or the Device fields
        (`set_device`). It reads the EMA under `eval_weights="ema"`, else
        the parameters. The width is fixed at setup from the first batch of val,
        else test, else train, else any split; a handle with no data takes it from
        the first batch `predict` receives.

        Args:
            batch: a mapping (or a NamedTuple) of field name to array, each of
                shape (n, ...) with the batch axis first, host or device; or an
                iterable of such batches (a split, a list, a generator).

        Returns:
            For one batch: `forward`'s outputs tree with every leaf a host NumPy
            array of shape (n, ...), n the batch's real sample count, in the dtype
            `forward` computed it in. For an iterable: a lazy iterator yielding one
            such tree per batch; nothing runs until it is iterated, and the errors
            below are raised as it is.

        Raises:
            RoutingError: `batch` is a bare array or not iterable (forward is routed
                by field name, and the message names the fields it declares), a
                batch is not a mapping, or a batch lacks a field `forward`
                requires.
            ConfigError: a batch's routed fields disagree on the batch size, or one
                is a scalar.
            HookError: `forward` did not return `(outputs, state)`, or an output
                leaf lacks the batch axis first.
            StrippedHostError: traced code read a Host field.

        Example::

            logits = nitro.predict({"img": images})    # images: (6, 784) float32
            logits.shape, logits.dtype                 # ((6, 10), float32), on host
            for out in nitro.predict(nitro.data["test"]):   # lazy, one per batch
                ...
        """
        if is_one_batch(batch):
            host = self._run.evaluation
            return self._run_entry(lambda: predict_batch(host, batch), stoppable=False)
        refuse_predict_input(batch, self.prepared.routing.fields["forward"])
        return self._predict_many(batch)

    def render(
        self,
        batch: Any = None,
        *,
        split: str = "val",
        batches: int = 1,
        predictions: bool = False,
        out_dir: str | None = None,
        tag: str | None = None,
    ) -> list[str]:
        """Write one figure per sample through `visualize` and `save_figure`.

        Without `batch`, the first `batches` batches of `split`, in the source's
        order for its first epoch; with it, that batch. `visualize(self, outputs,
        *, <fields>)` draws one sample: it is called with the batch axis dropped
        from each field it declares (a rank-1 field yields its element) and from
        every output leaf; `outputs` is None when `predictions` is False.
        `save_figure(self, fig, stem)` writes what it returned and returns the
        path; a matplotlib Figure needs none (it is saved as `<stem>.png` and
        closed). Figures go to `out_dir` under the stem `<tag>_<i>` (`<i>` when the
        tag is empty), i the sample's index zero-padded to three digits and counted
        across batches.

        Args:
            batch: a batch dict (or NamedTuple) of arrays of shape (n, ...), batch
                axis first; None reads `split`.
            split: the split to read when `batch` is None (default "val").
            batches: how many of its batches to draw, an int >= 1 (default 1); each
                writes one figure per sample.
            predictions: False (the data gate) passes `outputs=None` and compiles
                and runs nothing on the device; True passes each sample's slice of
                `predict(batch)`.
            out_dir: the directory, created if missing (default `<run_dir>/viz`).
            tag: the stem's prefix (default the split name, or "" with `batch`).

        Returns:
            list[str]: the paths written, one per sample, in order.

        Raises:
            HookError: the experiment has no `visualize`; `visualize` returned
                something other than a matplotlib Figure and there is no
                `save_figure`.
            ConfigError: `split` is not in the data (as `evaluate` says it);
                `batches` is not an int >= 1; `split`'s source was released; a
                batch whose fields disagree on the batch size.
            RoutingError: `batch` (or a batch of the split) is not a mapping, or
                lacks a field `visualize` (or, with predictions, `forward`)
                declares.

        Example::

            paths = nitro.render(split="val")                    # the data gate
            paths = nitro.render(split="val", predictions=True)
            paths = nitro.render({"img": images}, predictions=True, tag="new")
        """
        if batch is None:
            self._run.splits.refuse_released(f"render(split={split!r})", (split,))
        return self._run_entry(
            lambda: rendering.render(
                self,
                batch,
                split=split,
                batches=batches,
                predictions=predictions,
                out_dir=out_dir,
                tag=tag,
            ),
            stoppable=False,
        )

    def _predict_many(self, batches: Iterable[Any]) -> Iterator[Any]:
        host = self._run.evaluation
        for batch in batches:
            yield self._run_entry(
                lambda b=batch: predict_batch(host, b), stoppable=False
            )

    def _run_entry(
        self, work: Any, *, stoppable: bool = True, setup_lines: bool = True
    ) -> Any:
        """Run a public entry point (`entry_call.run_entry`); `setup_lines`: log the
        deferred setup lines first (train logs them once it holds the lock)."""
        if setup_lines:
            self._log_setup_lines()
        return run_entry(
            self, self._run, work, request_stop=self.request_stop, stoppable=stoppable
        )

    def request_stop(self) -> None:
        """Ask the running entry point to stop, gracefully; it returns at once.

        Call it from a phase monitor, a logger or another thread; Ctrl+C during
        `train`, `validate`, `evaluate`, `predict` or `render` makes the same call.
        A `train()` leaves its step loop at the next step boundary, then still
        validates, logs and checkpoints that epoch, and returns with
        `stop_reason == "requested"`; the next `train()` finishes the cut epoch
        first. A standalone `validate()` or `evaluate()` stops between source
        batches and returns the metrics of the batches that ran. The request is
        cleared when the outermost entry point returns, so it stops one call; made
        while nothing runs, it is honoured by the next `train`, `validate` or
        `evaluate` (a `predict` or `render` between them does not stop, and leaves
        it pending).
        """
        self._run.stops.request()

    def on_epoch_end(self, hook: EpochEndHook) -> Nitro:
        """Call `hook(nitro, epoch, observations)` at the end of every epoch `train()`
        runs, on the host, after the epoch's validation and before its history row
        and its checkpoint: a place to evaluate more splits, log, or change Device
        fields (`set_device`) before the next epoch starts.

        `observations` holds `train_loss` (the epoch's mean train loss) and the
        epoch's validation metrics, flattened. The scalars the hook returns (a
        dict, or None for none) join those metrics: the history row, the validate
        line and the checkpoint's metrics hold them. Hooks run in the order they
        were registered, each seeing what the earlier ones returned; one that
        raises ends the run with that error, as a failing step does.

        Returns:
            This handle, so calls chain.

        Example::

            def test_too(nitro, epoch, observations):
                return {f"test/{k}": v for k, v in nitro.evaluate("test").items()}

            nitro.on_epoch_end(test_too).train()
        """
        refusals.refuse_epoch_end_hook(hook)
        self._run.epoch_end_hooks.append(hook)
        return self

    def set_device(self, *field_value: Any, **values: Any) -> Nitro:
        """Write Device fields of the live handle; compiles nothing.

        Each value is converted to the field's dtype on the host and placed on the
        device with the current value's sharding. The experiment is replaced by a
        copy holding the new values, which every program reads from its next call:
        a Device field is a traced input, outside the compile cache key. Nothing is
        written when any value is refused.

        Args:
            *field_value: one field as `(name, value)`, the positional form
                (`nitro.set_device("temperature", 2.0)`).
            **values: Device field name to its new value: a Python number or a
                NumPy or JAX array with the field's shape (a scalar for a 0-d
                field), cast to the field's dtype (a float is rounded to a float32
                field's precision; an integer field takes only whole values).

        Returns:
            This handle, so calls chain (`nitro.set_device(t=2.0).predict(b)`).

        Raises:
            ConfigError: a positional form other than one (name, value) pair, or
                one naming a field the keywords name too; a name that is no
                field; a GraphConst field (it bakes into
                the compiled graph: build a new Nitro) or a Host field (no program
                reads it); a scheduled field (the schedule overwrites it every
                step); a value that is not numeric, or that the field's dtype
                cannot hold (complex for a real field, a fraction or an
                out-of-range value for an integer field, a non-bool for a bool
                field); a value of another shape.

        Example::

            for t in (0.5, 1.0, 2.0):                   # zero compiles
                logits = nitro.set_device(temperature=t).predict(batch)
            nitro.set_device("temperature", 1.0)        # the positional form
        """
        updates = device_updates(
            self.prepared, self.experiment, field_value, dict(values)
        )
        self._run.values.set_devices(updates)
        return self

    def release(self) -> None:
        """Release every split's source (its `release()` method), once per handle.

        Training does this itself when it ends (at the `Done` or `Failed` phase,
        after the monitors ran); call it for a handle that only validated,
        predicted or exported. A second call, or one after training ended, does
        nothing. A source shared by two splits is released once; a source without
        a `release()` method holds nothing open and stays readable.

        The handle cannot read a released source again: `train`, `validate`,
        `evaluate` and `render` of a split refuse it with `ConfigError`, naming
        what released it. `predict` on batches passed to it is unaffected.

        Warns:
            NitroWarning: a split whose `release()` raised; the other splits are
                still released.

        It also lets go of the run directory's lock, which a `resume=` handle holds
        from its construction until its `train()` returns (see `train`).
        """
        self._run.splits.release("nitro.release()")
        self._run.lock.release()


RunHandle.register(Nitro)
