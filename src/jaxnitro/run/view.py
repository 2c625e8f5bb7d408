"""`RunView`: the read side of a run's handle: its state, settings and reports.

`Nitro` (`run.handle`) is a `RunView` that also acts: it runs setup and the verbs
(`train`, `validate`, `evaluate`, `predict`, `render`, `set_device`, ...). What is
here only reads the run's parts (`RunParts`), so a property never changes the run.
"""

from __future__ import annotations

from typing import Any, TextIO

from ..checkpoint.checkpointer import Checkpointer
from ..compile.executables import Executables
from ..devices.memory import memory_report
from ..errors import ConfigError
from ..experiment.values import to_host_value
from ..logging import protocol as logproto
from ..loop.prepared import Prepared
from ..loop.state import TrainState
from ..observe import phases
from ..observe.history import MetricHistory
from ..observe.transitions import PhaseRecorder
from . import costs, reports
from .config import RunConfig
from .device_fields import check_device_field
from .parts import RunParts
from .status import RunStatus
from .summary import ModelSummary, model_summary


class RunView:
    """What a run's handle shows: its state, its settings and its reports.

    The base of `Nitro`, which documents each of these as its own; the handle holds
    the run's parts once its setup finished.
    """

    _parts: RunParts | None
    phase_recorder: PhaseRecorder
    status: RunStatus
    data: dict[str, Any]
    executables: Executables

    @property
    def _run(self) -> RunParts:
        if self._parts is None:
            raise ConfigError("The handle's setup did not finish: it holds no state.")
        return self._parts

    # ------------------------------------------------------------------ setup -------
    @property
    def experiment(self) -> Any:
        """The experiment after device conversion, which every hook except
        `build_data` and `derive` sees.

        Its Device fields hold device values (`jax.Array`s in the field's dtype, 0-d
        for a scalar field); its GraphConst and Host fields hold host values.
        `set_device` replaces it with a copy holding the new values, so read the
        property again after one rather than keeping the old object.
        """
        return self._run.values.experiment

    @property
    def config(self) -> RunConfig:
        """The run's settings, fixed at construction: a frozen, typed `RunConfig`.

        One field per run keyword (`config.accum`, `config.monitor`, ...), each the
        keyword, else the experiment's method or field, else the default, with
        `config.sources` saying which; a resume's seed reads "record". Rebuild the
        `Nitro` to change one.
        """
        return self._run.config

    @property
    def parameters(self) -> Any:
        """The parameters: a pytree of `jax.Array`s with the structure, shapes and
        dtypes `build_model` returned.

        They are the fresh `build_model` values, or those a `weights=` / `resume=`
        source restored; after `train`, the trained values (or, with
        `restore_best`, the selected checkpoint's). Under `eval_weights="ema"`,
        evaluation and `predict` read the EMA instead of these.

        They are device arrays owned by the handle: the next optimizer step donates
        them, so copy them (e.g. `jax.device_get`) to keep a snapshot.
        """
        return self.train_state.params

    @property
    def states(self) -> Any:
        """The model state (running statistics and the like): a pytree of
        `jax.Array`s as `build_model` returned it (`{}` for a stateless model), or
        as a checkpoint restored it.

        Training carries forward's new state from step to step; evaluation and
        `predict` run in eval mode and discard it.
        """
        return self.train_state.model_state

    @property
    def prepared(self) -> Prepared:
        """What setup fixed (`Prepared`): the hooks, the routing, the split sizes,
        the optimizer plan, the stopping policy, the trace context, the run id."""
        return self._run.prepared

    @property
    def current_step(self) -> int:
        """The number of optimizer steps taken, as an `int`.

        With accum = N each optimizer step takes N micro-batches, so this is N times
        smaller than the micro-batch count. Schedules are indexed by it. A resumed
        handle starts from the record's step.
        """
        return 0 if self._parts is None else self._parts.values.state.step

    @property
    def current_epoch(self) -> int:
        """The current epoch, as an `int`: 0 before the first one begins.

        During `train()`, the epoch running; afterwards, the last one trained. A
        resumed handle starts from the record's epoch.
        """
        return 0 if self._parts is None else self._parts.values.state.epoch

    @property
    def train_state(self) -> TrainState:
        """The run's latest `TrainState`: weights, optimizer state, EMA, model state,
        accumulator, step, epoch, and `held`: where a stop cut the epoch (None when
        the last epoch ended whole).

        Its arrays are owned by the handle: the next optimizer step donates them, so
        copy what you keep (e.g. `jax.device_get`).

        Raises:
            ConfigError: the handle's setup did not finish.
        """
        return self._run.values.state

    @property
    def checkpoint_source(self) -> str | None:
        """The record file the weights came from: the resumed or `weights=` record,
        or the one `restore_best` loaded; None for fresh weights, a warm start or
        an average."""
        return self._run.values.checkpoint_source

    @property
    def weights_from(self) -> dict[str, Any] | None:
        """For a warm start from another handle, its experiment, epoch, step and
        run_dir; None otherwise."""
        return self._run.values.weights_from

    @property
    def averaged_from(self) -> dict[str, Any] | None:
        """What an averaged weights source averaged (`weights=(run,
        Average(sel))`, or `restore_best=Average(...)` once training ends): the
        spec, run, dir, files, epochs and weights; None otherwise. The records
        this run writes carry it too."""
        return self._run.values.averaged_from

    @property
    def run_dir(self) -> str:
        """The run directory this handle resolved: the `run_dir` keyword, else the
        accessor (default `runs/<experiment class name>`), as a `str`.

        Checkpoints and the manifest (unless the checkpointer has its own `dir`), the
        default `JSONLogger`'s `metrics.jsonl` and `resume="auto"` resolve against
        it, and `render` writes to `<run_dir>/viz` by default.
        """
        return self._run.config.run_dir

    @property
    def phase(self) -> phases.Phase:
        """The run's current `Phase`: the latest recorded transition (`Starting()`
        until the first). Idle, announced when control returns, is never recorded,
        so after `train()` this reads `Done()` or `Failed()`, and after a
        standalone `validate` or `predict` the phase the run was in before."""
        return self.phase_recorder.phase

    @property
    def history(self) -> MetricHistory:
        """The epochs this handle trained, as a `MetricHistory` table.

        Each row: epoch, step (the optimizer step the epoch ended on), train_loss
        (the epoch's mean train loss), the epoch's validation metrics under the
        names validation reported (the validation loss is `loss`), seconds. An
        epoch a stop cut short has a row, replaced when the next `train()` finishes
        that epoch. The table's selection metric (which picks its best row, and
        whose column follows train_loss) is the checkpointer's metric and mode
        when it has them, else the monitor. A resumed handle's history begins at
        the first epoch it trained itself, and the table notes the earlier ones.
        Nothing is read from disk: the table is built from the handle on each read.
        """
        ckpt = self.checkpointer
        if ckpt is not None and ckpt.metric is not None:
            selection: tuple[str, str] | None = (ckpt.metric, ckpt.mode or "min")
        else:
            selection = self.prepared.monitor
        return MetricHistory(
            self.status.history,
            selection_metric=selection,
            resumed_from_epoch=self.prepared.resumed_from_epoch,
        )

    @property
    def logger_info(self) -> dict[str, Any]:
        """Plain data identifying where the run's logger writes, as a `dict`.

        The logger's own `logger_info()` (`{"path": ...}` for a `JSONLogger`); `{}`
        for a logger without that method, or with logging off.
        """
        return logproto.logger_info(self.logger)

    @property
    def logger(self) -> Any:
        """The run's logger object (None when logging is off)."""
        return None if self._parts is None else self._parts.config.logger

    @property
    def checkpointer(self) -> Checkpointer | None:
        """The run's `Checkpointer`, or None when checkpointing is off.

        Setup binds it to this run: to run_dir (unless it was given its own `dir`),
        to the monitor (unless it was given its own metric and mode) and to this
        run's id (`checkpoint_run`).
        """
        return self._run.config.checkpointer

    @property
    def early_stop(self) -> Any:
        """This handle's early-stopping policy (None: it never stops early).

        An EarlyStopping passed in is copied at setup with the monitor filled in and
        fresh counters (`best`, `wait`), so this is that copy, never the instance
        passed; a custom policy (an object with `should_stop`) is held as given. A
        resume restores the counters the record stored. None also on a handle with
        no train split, which never trains.
        """
        return self._run.prepared.stopper

    @property
    def stop_reason(self) -> str | None:
        """How the last `train()` ended, as a `str`, or None before one ran.

        "completed" (max_epochs reached), "early_stop" (the early-stopping policy
        stopped it), "requested" (`request_stop()` or Ctrl+C), "preempted" (a
        SIGTERM) or "error" (it raised). A `train()` that had nothing to train
        leaves it unchanged.
        """
        return self._run.stops.reason

    @property
    def checkpoint_run(self) -> str | None:
        """The id this handle's checkpoints are written under, as a `str`.

        It is the `run` of their manifest entries, and names the run in a source
        such as `weights=(run_id, "best")`. Resuming a run's newest record adopts
        that run's id; any other construction gets a new one. None when
        checkpointing is off, and for a handle continuing the unnamed run of a
        manifest written before runs were recorded.
        """
        return self._run.prepared.run_id if self.checkpointer is not None else None

    # ---------------------------------------------------------------- reports -------
    def frozen(self) -> dict[str, Any]:
        """The values this handle fixed at construction: seed, preset, accum,
        max_epochs, the schedule horizon, the clip threshold and run_dir."""
        return reports.frozen(self)

    def params_to_log(self) -> dict[str, Any]:
        """The flat hyperparameters log_params receives.

        A scalar field logs its value. A non-scalar GraphConst or Device field logs
        as its type name (an array as its type and size), and a non-scalar Host
        field (dataset-sized state, say) is not logged: the spec's per-field rule,
        which is why a config of knobs is better flattened into fields.
        """
        return reports.params_to_log(self)

    def binding_report(self) -> str:
        """Where each configured value bound, the data, and the routed fields."""
        return reports.binding_report(self, self._run.evaluation.eval_width)

    def cost_report(self, file: TextIO | None = None) -> list[dict[str, Any]]:
        """Print each compiled program's cost by XLA's analysis, and the step's rate.

        One line per program this handle compiled (its FLOPs and bytes moved per
        call, from `Compiled.cost_analysis()`), then the optimizer step: its mean
        measured time over the last epoch trained (stepping only), its FLOPs and
        bytes, and the FLOP/s and bytes/s it achieved.

        Args:
            file: where to print; standard output by default.

        Returns:
            list[dict]: a row per program (`program`, `flops`, `bytes`), then one
            for the optimizer step once an epoch was trained (also `seconds`,
            `flops_per_second`, `bytes_per_second`). A figure XLA does not give is
            None.

        Example::

            nitro.train()
            nitro.cost_report()
            # train_step       1.2 MFLOP      412 kB
            # optimizer step: 0.61 ms measured (last epoch), ... 1.97 GFLOP/s ...
        """
        return costs.cost_report(self, file)

    def summary(self) -> ModelSummary:
        """The model's parameters per optimizer group, their bytes, the step's cost
        and the programs compiled, as a `ModelSummary` (print it for the table).

        The step's FLOPs and bytes are XLA's cost analysis of the compiled train
        program once this handle trained; before that, of one train batch's
        gradient lowered from shapes (nothing is compiled or run; the optimizer
        update is left out), and `step_source` says which. Each compiled program
        is listed with the seconds its compile took, or as cached.

        Returns:
            ModelSummary: the figures; `str()` of it is the table.

        Example::

            print(Nitro(MyExp()).summary())
            # MyExp: 4,227 parameters (16.9 kB) in 1 group
            # ...
        """
        return model_summary(self)

    def memory_report(self) -> dict[str, dict[str, int]]:
        """Bytes of the parameters, optimizer state and EMA each device holds.

        Returns:
            dict[str, dict[str, int]]: per device (`str(device)`), `params`,
            `opt_state`, `ema` and their `total`, summed over the shards the
            device holds. Under `sharding="fsdp"` on n devices each figure is
            about 1/n of the replicated one.

        Example::

            Nitro(e, n_devs=4, sharding="fsdp").memory_report()
            # {'TFRT_CPU_0': {'params': 264192, 'opt_state': 0, 'ema': 0, ...}, ...}
        """
        state = self.train_state
        return memory_report(
            {"params": state.params, "opt_state": state.opt_state, "ema": state.ema}
        )

    def device_value(self, name: str) -> Any:
        """The host value of a Device field: the counterpart of `set_device`.

        A scheduled field reads as the value training last used (it is synced
        after each epoch).

        Args:
            name: the name of a Device field of the experiment.

        Returns:
            A Python scalar for a 0-d field (a float32 reads back as the shortest
            decimal that round-trips: 0.05, not 0.05000000074505806), else a NumPy
            array with the field's shape and dtype.

        Raises:
            ConfigError: `name` is a GraphConst or a Host field, or no field; read
                those as `nitro.experiment.<name>`.
        """
        check_device_field(self.prepared.cls, name)
        return to_host_value(getattr(self.experiment, name))

    def __rich__(self) -> Any:
        """The frozen values as a rich table (a terminal); `repr` is the plain text."""
        return reports.rich_view(self, restored_best=self._run.values.restored_best)

    def __repr__(self) -> str:
        return reports.text_view(self, restored_best=self._run.values.restored_best)
