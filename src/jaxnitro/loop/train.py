"""The automatic training loop: epochs of micro-batches, validation, checkpoints, logs.

With accum == 1 each batch runs one fused train_step program; with accum > 1 each
micro-batch runs the gradient program, and every accum-th the optimizer program. Then
the loop reads back the PREVIOUS micro-batch's loss: the device runs ahead by one
micro-batch while the host waits. The executable call itself transfers the routed host
fields, so a batch's device buffers live exactly as long as the step that uses them (an
explicit `jax.device_put` of the batch dict cost a third of a dispatch-bound step). A
non-finite loss raises naming its step and epoch. After each epoch: validation, one
history row, the validate log line, and the checkpoint.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from .._version import __version__
from ..checkpoint.record import Record
from ..compile.cache import program_cache
from ..compile.programs import gradient_fn, optimizer_fn, train_step_fn
from ..data.sources import batch_size, epoch_batches
from ..errors import ConfigError, DivergenceError, NitroWarning
from ..logging import protocol as logproto
from ..observe import phases
from ..optim.rules import init_state
from ..view import graphconst_record
from .evaluate import compiled, evaluate_split

if TYPE_CHECKING:
    from ..handle import Nitro


@dataclass
class _InFlight:
    """A dispatched micro-batch whose loss has not been read back yet."""

    loss: Any
    terms: Any
    stats: Any
    outputs: Any
    host_batch: dict[str, Any]
    step: int
    ends_step: bool


class _EpochLog:
    """The host side of one epoch: read-backs, the divergence check, train lines."""

    def __init__(self, nitro: Nitro, epoch: int) -> None:
        self.nitro = nitro
        self.epoch = epoch
        self.losses: list[float] = []
        self.step_losses: list[float] = []
        self.check = bool(nitro._config["check_divergence"].value)
        self.every = int(nitro._config["log_every_n_steps"].value)
        self.logging = nitro.logger is not None

    def settle(self, item: _InFlight) -> None:
        loss = float(item.loss)
        if self.check and not math.isfinite(loss):
            raise DivergenceError(
                f"The training loss is {loss} at step {item.step} of epoch "
                f"{self.epoch}. There is no rollback: resume from the last checkpoint "
                f"with a lower learning rate, or pass check_divergence=False to "
                f"continue from the diverged state."
            )
        self.losses.append(loss)
        self.step_losses.append(loss)
        if not item.ends_step:
            return
        if self.logging and item.step % self.every == 0:
            line: dict[str, Any] = {
                "loss": sum(self.step_losses) / len(self.step_losses)
            }
            for name, value in jax.device_get(item.terms).items():
                line[f"loss/{name}"] = float(value)
            stats = item.stats
            if item.outputs is not None:
                hook = self.nitro._hooks["train_metrics"]
                names = self.nitro._fields["train_metrics"].select(
                    tuple(item.host_batch)
                )
                stats = hook(
                    self.nitro.experiment,
                    jax.device_get(item.outputs),
                    **{k: item.host_batch[k] for k in names},
                )
            for name, value in dict(jax.device_get(stats) or {}).items():
                line[str(name)] = _scalar(value)
            logproto.log_metrics(
                self.nitro.logger,
                line,
                step=item.step,
                epoch=self.epoch,
                context="train",
            )
        self.step_losses = []

    def mean_loss(self) -> float:
        return sum(self.losses) / len(self.losses) if self.losses else math.nan


def _scalar(value: Any) -> Any:
    array = np.asarray(value)
    return array.item() if array.ndim == 0 else array


def _programs(nitro: Nitro, example_batch: dict[str, Any]) -> tuple[Any, Any]:
    """The training executables, from the handle or the cache.

    accum == 1: `(train_step, None)`, one fused program per step. accum > 1:
    `(gradient, optimizer)`, the gradient accumulated over micro-batches.
    """
    ctx = nitro._ctx
    accum = int(nitro._config["accum"].value)
    plan = nitro._plan
    fields = nitro._gradient_fields
    traced = ("forward", "loss") + (
        ("train_metrics",) if fields.train_metrics is not None else ()
    )
    shapes = tuple((k, v.shape, str(v.dtype)) for k, v in example_batch.items())
    hp = plan.hyperparams(0)

    def announce(kind: str) -> None:
        nitro.set_phase(phases.COMPILE_PHASES[kind]())

    if accum == 1:
        args = (
            nitro.device_values(),
            nitro._params,
            nitro._opt_state,
            nitro._state,
            example_batch,
            hp,
        )
        step = compiled(
            nitro,
            "train_step",
            (shapes, fields, tuple(plan.constants().items())),
            lambda: ctx.compile(
                program_cache(),
                "train_step",
                train_step_fn(ctx, fields, plan),
                args,
                traced=traced,
                baked={"mode": "train", "fields": fields, **plan.constants()},
                donate=(1, 2),
                on_compile=announce,
            ),
        )
        nitro.set_phase(phases.TrainStepping())
        return step, None

    grad_args = (
        nitro.device_values(),
        nitro._params,
        nitro._state,
        nitro._accumulator,
        example_batch,
    )
    gradient = compiled(
        nitro,
        "gradient",
        (shapes, accum, fields),
        lambda: ctx.compile(
            program_cache(),
            "gradient",
            gradient_fn(ctx, fields, accum),
            grad_args,
            traced=traced,
            baked={"inv_accum": 1.0 / accum, "mode": "train", "fields": fields},
            donate=(3,),
            on_compile=announce,
        ),
    )
    opt_args = (nitro._params, nitro._opt_state, nitro._accumulator, hp)
    optimizer = compiled(
        nitro,
        "optimizer",
        tuple(plan.constants().items()),
        lambda: ctx.compile(
            program_cache(),
            "optimizer",
            optimizer_fn(plan),
            opt_args,
            traced=(),
            baked=plan.constants(),
            donate=(0, 1, 2),
            on_compile=announce,
        ),
    )
    nitro.set_phase(phases.TrainStepping())
    return gradient, optimizer


def _ensure_optimizer_state(nitro: Nitro) -> None:
    if nitro._opt_state is not None:
        return
    fresh = init_state(nitro._plan, nitro._params)
    record: Record | None = nitro._record if nitro._resume is not None else None
    if record is not None and record.has_tree("opt_state"):
        nitro._opt_state = record.restore("opt_state", fresh, "optimizer state")
    else:
        nitro._opt_state = jax.tree.map(jnp.array, fresh)
    # The record's arrays are no longer needed: params, state and opt state are placed.
    nitro._record = None


def _check_batch(
    host: dict[str, np.ndarray],
    names: tuple[str, ...],
    expected: int,
    index: int,
    epoch: int,
) -> None:
    """Refuse a train batch of another size (a partial batch met mid-epoch)."""
    for name in names:
        if host[name].shape[:1] != (expected,):
            size = batch_size(host, names)
            raise ConfigError(
                f"Train batch {index} of epoch {epoch} holds {size} samples, the "
                f"first held {expected}. The train split must drop its partial last "
                f"batch and keep one batch size (drop_remainder=True / drop_last=True)."
            )


def _run_epoch(nitro: Nitro, epoch: int) -> _EpochLog:
    # The hot loop of a dispatch-bound run: every attribute it reads per step is
    # bound to a local first, and the per-step work is the dispatch plus one read-back.
    accum = int(nitro._config["accum"].value)
    names = nitro._train_fields
    expected = nitro._train_batch
    assert expected is not None
    log = _EpochLog(nitro, epoch)
    settle = log.settle
    gradient: Any = None
    optimizer: Any = None
    in_flight: _InFlight | None = None
    plan = nitro._plan
    constant_hp = plan.hyperparams(nitro._step) if plan.is_constant else None
    for index, batch in enumerate(epoch_batches(nitro.data["train"], epoch - 1)):
        values = nitro._device_values  # set_device may replace it between steps
        host = {k: np.asarray(batch[k]) for k in names}
        _check_batch(host, names, expected, index, epoch)
        if gradient is None:
            gradient, optimizer = _programs(nitro, host)
        hp = constant_hp if constant_hp is not None else plan.hyperparams(nitro._step)
        if accum == 1:
            (
                nitro._params,
                nitro._opt_state,
                loss,
                nitro._state,
                terms,
                stats,
                outputs,
            ) = gradient(
                values, nitro._params, nitro._opt_state, nitro._state, host, hp
            )
            ends_step = True
        else:
            nitro._accumulator, loss, nitro._state, terms, stats, outputs = gradient(
                values, nitro._params, nitro._state, nitro._accumulator, host
            )
            ends_step = (index + 1) % accum == 0
            if ends_step:
                nitro._params, nitro._opt_state, nitro._accumulator = optimizer(
                    nitro._params, nitro._opt_state, nitro._accumulator, hp
                )
        if ends_step:
            nitro._step += 1
        current = _InFlight(loss, terms, stats, outputs, host, nitro._step, ends_step)
        if in_flight is not None:
            settle(in_flight)
        in_flight = current
        if ends_step and nitro._stop_requested:
            break
    if in_flight is not None:
        settle(in_flight)
    return log


def _flat(metrics: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flat(value, name + "/"))
        else:
            flat[name] = value
    return flat


def _checkpoint(
    nitro: Nitro, epoch: int, metrics: dict[str, Any], reason: str | None
) -> None:
    ckpt = nitro.checkpointer
    if ckpt is None:
        return
    e = nitro.experiment
    meta = {
        "framework_version": __version__,
        "experiment": f"{type(e).__module__}.{type(e).__qualname__}",
        "epoch": epoch,
        "step": nitro.current_step,
        "seed": int(nitro._config["seed"].value),
        "preset": nitro._preset,
        "graphconst": graphconst_record(e),
        "config": nitro.params_to_log(),
        "derived": list(nitro._derived_keys),
        "logger_type": type(nitro.logger).__name__
        if nitro.logger is not None
        else None,
        "logger_state": logproto.logger_state(nitro.logger),
        "run_id": logproto.run_id(nitro.logger),
        "run_url": logproto.run_url(nitro.logger),
    }
    trees = {
        "params": nitro._params,
        "state": nitro._state,
        "opt_state": nitro._opt_state,
        "device": nitro.device_values(),
    }
    scalars = {k: v for k, v in _flat(metrics).items() if np.ndim(v) == 0}
    ckpt.save(
        epoch=epoch,
        step=nitro.current_step,
        metrics=scalars,
        trees=trees,
        meta=meta,
        stop_reason=reason,
    )


def run_training(nitro: Nitro) -> None:
    """Train `nitro` from its current epoch to max_epochs (or a requested stop)."""
    if "train" not in nitro.data:
        raise ConfigError(
            f"train() needs a train split; the data holds: "
            f"{', '.join(nitro.data) or 'no splits'}."
        )
    max_epochs = int(nitro._config["max_epochs"].value)
    if nitro.current_epoch >= max_epochs:
        warnings.warn(
            f"Nothing to train: the handle is at epoch {nitro.current_epoch} and "
            f"max_epochs is {max_epochs}. Pass a larger max_epochs to train longer.",
            NitroWarning,
            stacklevel=3,
        )
        return
    accum = int(nitro._config["accum"].value)
    nitro._stop_requested = False
    nitro._stop_reason = None
    _ensure_optimizer_state(nitro)
    if accum > 1 and nitro._accumulator is None:
        nitro._accumulator = jax.tree.map(jnp.zeros_like, nitro._params)
    reason = "error"
    try:
        for epoch in range(nitro.current_epoch + 1, max_epochs + 1):
            nitro._epoch = epoch
            nitro.set_phase(phases.TrainStepping())
            started = time.perf_counter()
            log = _run_epoch(nitro, epoch)
            requested = nitro._stop_requested
            metrics = (
                evaluate_split(nitro, "val", stoppable=False)
                if "val" in nitro.data
                else {}
            )
            row = {
                "epoch": epoch,
                "step": nitro.current_step,
                "train_loss": log.mean_loss(),
            }
            row.update(_flat(metrics))
            row["seconds"] = time.perf_counter() - started
            nitro._history.append(row)
            if metrics:
                logproto.log_metrics(
                    nitro.logger,
                    _flat(metrics),
                    step=nitro.current_step,
                    epoch=epoch,
                    context="validate",
                )
            if requested:
                reason = "requested"
            elif epoch == max_epochs:
                reason = "completed"
            _checkpoint(nitro, epoch, metrics, reason if reason != "error" else None)
            if requested:
                break
    except BaseException as error:
        nitro._stop_reason = "error"
        nitro.set_phase(phases.Failed())
        try:
            logproto.finish(nitro.logger, "error")
        except Exception as finish_error:  # never mask the error that ended the run
            error.add_note(f"The logger's finish('error') also failed: {finish_error}")
        raise
    nitro._stop_reason = reason
    logproto.finish(nitro.logger, reason)
    nitro.set_phase(phases.Done())
