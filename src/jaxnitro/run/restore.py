"""Where a handle's starting weights come from, and what it loads when training ends.

`resume=` continues a run exactly (weights, state, optimizer state, EMA, position,
counters). `weights=` names the starting parameters only: a record file, a `(run,
which)` pair, an average of a run's checkpoints, or a live handle (a warm start
through host memory, leaf for leaf). `restore_optimizer=True` also restores a
record's optimizer state, checked against the optimizer this run builds, while step,
epoch and schedules start fresh. `restore_best` ends a successful `train()` holding
the run's own best checkpoint (or an average of its checkpoints).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from ..checkpoint.averaging import Average, check_keep_holds, short_average_message
from ..checkpoint.lookup import selected_checkpoint
from ..checkpoint.record import CheckpointRecord
from ..checkpoint.sources import (
    AverageSource,
    HandleSource,
    ResolvedSource,
    resolve_weights_source,
    resume_source,
)
from ..compile.boundary import owned_copy
from ..errors import CheckpointError, ConfigError, NitroWarning
from ..loop.state import TrainState
from ..optim.plan import OptimizerPlan
from .config import RunConfig

if TYPE_CHECKING:
    from .handle import Nitro
    from .values import RunValues

RESTORED_BEST_REFUSAL = """\
This handle ended its last train() holding its best checkpoint (restore_best), beside
the optimizer state and step of where training stopped: a state no run was ever in.
It will not train further. To continue, build a new Nitro:
  Nitro(e, run_dir=..., resume="auto")                     # continue where it stopped
  Nitro(e, run_dir=..., resume=(run_id, "best"))           # continue from the best
  Nitro(e, run_dir=..., weights=(run_id, "best"))          # a new run from the best"""


@dataclass(frozen=True)
class Located:
    """What `resume=` and `weights=` name, resolved before anything is built.

    Attributes:
        resume: the record a resume continues, or None.
        weights: the weights source (a record, an average, a live handle), or None.
        record: the record either loads (an average's, for an average), or None.
        checkpoint_source: the record file the weights come from, if one file.
        averaged_from: what an averaged source averaged, or None.
    """

    resume: ResolvedSource | None
    weights: Any
    record: CheckpointRecord | None
    checkpoint_source: str | None
    averaged_from: dict[str, Any] | None


def locate(config: RunConfig, run_dir: str, monitor: tuple[str, str] | None) -> Located:
    """Resolve `resume=` and `weights=` before anything expensive runs."""
    ckpt = config.checkpointer
    weights = config.weights
    restore_optimizer = config.restore_optimizer
    if config.resume not in (None, False) and weights is not None:
        raise ConfigError(
            "resume= and weights= were both given: resume continues a run exactly "
            "(weights, optimizer, position); weights= starts a new run from weights. "
            "Pass one."
        )
    if restore_optimizer and config.resume not in (None, False):
        raise ConfigError(
            "restore_optimizer=True goes with weights=, not resume=: a resume "
            "restores the optimizer state anyway."
        )
    resume = resume_source(config.resume, run_dir, ckpt, monitor=monitor)
    source_of_weights = (
        resolve_weights_source(
            weights,
            run_dir,
            ckpt,
            "weights",
            monitor=monitor,
            restore_optimizer=restore_optimizer,
        )
        if weights is not None
        else None
    )
    if restore_optimizer and not isinstance(source_of_weights, ResolvedSource):
        kind = (
            "no source"
            if source_of_weights is None
            else type(source_of_weights).__name__
        )
        raise ConfigError(
            f"restore_optimizer=True restores the optimizer state of a checkpoint "
            f"record, but weights= gives {kind}. Pass weights= a record path or a "
            f'(run, "best" | "latest") pair.'
        )
    source = resume or source_of_weights
    record = (
        source.load() if isinstance(source, ResolvedSource | AverageSource) else None
    )
    averaged_from = None
    if isinstance(source, AverageSource):
        assert record is not None
        averaged_from = record.header.averaged_from
    return Located(
        resume=resume,
        weights=source_of_weights,
        record=record,
        checkpoint_source=source.path if isinstance(source, ResolvedSource) else None,
        averaged_from=averaged_from,
    )


def restore_weights(
    built: TrainState,
    source: Any,
    record: CheckpointRecord | None,
    *,
    resuming: bool,
    load_ema: bool,
) -> tuple[TrainState, dict[str, Any] | None]:
    """The state a handle starts from: `built` (what build_model returned) with the
    source's parameters and model state, and a resume's EMA too; and, for a live
    handle as the source, what it was (`weights_from`)."""
    if isinstance(source, HandleSource):
        return _warm_start(built, source.handle, load_ema)
    if record is None:
        if load_ema:
            raise ConfigError(
                "load_ema=True loads a weights source's EMA, but no weights= was given."
            )
        return built, None
    if load_ema and resuming:
        raise ConfigError(
            "load_ema=True goes with weights=, not resume=: a resume restores the "
            "weights and their EMA exactly as they were."
        )
    if load_ema and not record.has_tree("ema"):
        raise ConfigError(
            f"load_ema=True, but {record.path} holds no EMA of the weights (its run "
            f"had no ema). Drop load_ema, or load a record written with one."
        )
    fresh = built.params
    params = record.restore("ema" if load_ema else "params", fresh, "parameter")
    model_state = record.restore("state", built.model_state, "state")
    ema = None
    if resuming and record.has_tree("ema"):
        ema = record.restore("ema", fresh, "EMA")
    return built._replace(
        weights=built.weights._replace(params=params, ema=ema), model_state=model_state
    ), None


def _warm_start(
    built: TrainState, other: Any, load_ema: bool
) -> tuple[TrainState, dict[str, Any]]:
    """Take another live handle's weights through host memory, leaf for leaf."""
    theirs = other.train_state
    if load_ema and theirs.ema is None:
        raise ConfigError(
            "load_ema=True, but the handle given as weights= has no EMA of the weights."
        )
    source = theirs.ema if load_ema else theirs.params
    params = _leaf_for_leaf(source, built.params, "parameter")
    model_state = _leaf_for_leaf(theirs.model_state, built.model_state, "state")
    weights_from = {
        "experiment": type(other.experiment).__qualname__,
        "epoch": other.current_epoch,
        "step": other.current_step,
        "run_dir": other.run_dir,
    }
    return built._replace(
        weights=built.weights._replace(params=params), model_state=model_state
    ), weights_from


def _leaf_for_leaf(source: Any, template: Any, what: str) -> Any:
    got, want = jax.tree.structure(source), jax.tree.structure(template)
    if got != want:  # type: ignore[operator]
        raise CheckpointError(
            f"weights=<Nitro>: its {what} tree does not match this model's: "
            f"{got} against {want}."
        )
    leaves = []
    for path, (a, b) in zip(
        [p for p, _ in jax.tree_util.tree_flatten_with_path(template)[0]],
        zip(jax.tree.leaves(source), jax.tree.leaves(template), strict=True),
        strict=True,
    ):
        there, here = _leaf_type(a), _leaf_type(b)
        if there != here:
            raise CheckpointError(
                f"weights=<Nitro>: {what} leaf {jax.tree_util.keystr(path)} is "
                f"{there} there but {here} here."
            )
        leaves.append(_through_host(a))
    return jax.tree.unflatten(want, leaves)


def _leaf_type(leaf: Any) -> str:
    """`float32[16]`, `key<fry>[]`: what must agree for a leaf to be taken over."""
    return f"{jnp.asarray(leaf).dtype}{list(np.shape(leaf))}"


def _through_host(leaf: Any) -> Any:
    """A fresh device copy of `leaf` through host memory; typed PRNG keys stay keys."""
    leaf = jnp.asarray(leaf)
    if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        data = np.asarray(jax.random.key_data(leaf))
        return jax.random.wrap_key_data(
            jnp.asarray(data), impl=jax.random.key_impl(leaf)
        )
    return jnp.asarray(np.asarray(leaf))


def starting_state(
    values: RunValues, plan: OptimizerPlan, *, manual: bool, accum: int
) -> TrainState:
    """The train state a train() starts from: the optimizer state restored from the
    pending record (a resume, `restore_optimizer=True`) or allocated fresh, the EMA
    and the accumulator allocated; the values' state as it is where all three are
    in place."""
    state = values.state
    params = state.params
    # Manual mode: setup_optimizers built the states at construction; a resume
    # restores the record's arrays into that structure (rules kept).
    restoring = manual and values.pending_record is not None
    if restoring or state.opt_state is None:
        # The record's arrays are no longer needed once placed: taken here.
        record = values.take_pending_record()
        fresh = state.opt_state if restoring else plan.init_state(params)
        state = state.with_weights(opt_state=optimizer_state(record, plan, fresh))
    if plan.ema is not None and state.ema is None:
        state = state.with_weights(ema=owned_copy(params))  # the weights
    if accum > 1 and state.accumulator is None:
        state = state._replace(accumulator=jax.tree.map(jnp.zeros_like, params))
    return state


def optimizer_state(
    record: CheckpointRecord | None, plan: OptimizerPlan, fresh: Any
) -> Any:
    """The optimizer state training starts from: `record`'s (the one a resume or
    `restore_optimizer=True` keeps for train() to restore), else `fresh`."""
    if record is None:
        return owned_copy(fresh)
    # A stateless rule (plain SGD): its state has no arrays, so no record holds any,
    # and the fresh state is the restored one.
    stateless = not jax.tree.leaves(fresh)
    if not stateless and not record.has_tree("opt_state"):
        raise CheckpointError(
            f"{record.path} holds no optimizer state (it was written by a run that "
            f"never trained, or by average_checkpoints)."
        )
    recorded = record.header.optimizer_layout
    if recorded is not None:  # a record from before it was stored: leaf for leaf only
        _check_optimizer_layout(record.path, recorded, plan.state_layout())
    return fresh if stateless else record.restore("opt_state", fresh, "optimizer state")


def _check_optimizer_layout(
    path: str, recorded: dict[str, Any], mine: dict[str, Any]
) -> None:
    """Refuse optimizer state written under another rule or group layout.

    Only what shapes the state counts (`OptimizerPlan.state_layout`): an EMA, gradient
    clipping or other step values may change between the runs.
    """
    differ = [
        f"{key}: {recorded.get(key, 'absent')!r} in the record, "
        f"{mine.get(key, 'absent')!r} in this run"
        for key in dict.fromkeys([*mine, *recorded])
        if recorded.get(key) != mine.get(key)
    ]
    if differ:
        more = f" ({len(differ)} differences in all)" if len(differ) > 3 else ""
        raise CheckpointError(
            f"{path} was written with another optimizer (rule or group layout) than "
            f"this run builds, so its optimizer state does not apply: "
            f"{'; '.join(differ[:3])}{more}. Build the rule and parameter groups it "
            f"was trained with, or take its weights alone (weights= without "
            f"restore_optimizer), which starts the optimizer fresh."
        )


def check_restore_optimizer(config: RunConfig, data: Mapping[str, Any]) -> None:
    """restore_optimizer needs an optimizer to restore into: a train split."""
    if config.restore_optimizer and "train" not in data:
        raise ConfigError(
            "restore_optimizer=True, but this handle has no train split, so it has no "
            "optimizer to restore into. Drop restore_optimizer, or pass a train split."
        )


def check_restore_best(config: RunConfig, data: Mapping[str, Any]) -> Any:
    """Validate `restore_best=` at setup; the value to act on at the end."""
    value = config.restore_best
    if value is False or value is None:
        return None
    if "train" not in data:
        raise ConfigError(
            "restore_best acts when train() ends; this handle has no train split."
        )
    ckpt = config.checkpointer
    if ckpt is None:
        raise ConfigError(
            "restore_best loads the run's own best checkpoint, but checkpointing is "
            "off (checkpointer=None)."
        )
    if isinstance(value, Average):
        check_keep_holds(ckpt, value, "restore_best")
        return value
    if value is True:
        if not ckpt.ranks:
            raise ConfigError(
                f"restore_best=True loads the best checkpoint, but keep={ckpt.keep!r} "
                f"never ranks one. Keep a Best(k) too."
            )
        return True
    raise ConfigError(
        f"restore_best={value!r}: it is True, False, or an Average(selector)."
    )


def finish_restore_best(nitro: Nitro, values: RunValues) -> None:
    """At the end of a train() that did not fail: load the run's selected weights.

    A checkpoint that cannot be found or read warns and keeps the final weights:
    training succeeded, and its records are on disk.
    """
    choice = nitro.prepared.restore_best
    if choice is None:
        return
    try:
        found = _restore_best_record(nitro, choice)
    except CheckpointError as error:
        warnings.warn(
            f"restore_best: {error}; keeping the final weights.",
            NitroWarning,
            stacklevel=3,
        )
        return
    if found is None:
        return
    record, path = found
    state = values.state
    fresh = state.params
    params = record.restore("params", fresh, "parameter")
    model_state = record.restore("state", state.model_state, "state")
    ema = state.ema
    if ema is not None and record.has_tree("ema"):
        ema = record.restore("ema", fresh, "EMA")
    values.restore_best(
        state._replace(
            weights=state.weights._replace(params=params, ema=ema),
            model_state=model_state,
        ),
        path,
        record.header.averaged_from if isinstance(choice, Average) else None,
    )


def _restore_best_record(
    nitro: Nitro, choice: Any
) -> tuple[CheckpointRecord, str | None] | None:
    """The record restore_best loads and its file (None for an average), or None
    after warning that the run holds nothing to load."""
    ckpt = nitro.checkpointer
    assert ckpt is not None
    if choice is True:
        best = selected_checkpoint(ckpt, nitro.run_dir, run=nitro.checkpoint_run)
        if best is None:
            warnings.warn(
                "restore_best: this run has no scored checkpoint; keeping the final "
                "weights.",
                NitroWarning,
                stacklevel=4,
            )
            return None
        return CheckpointRecord(best.path), best.path
    source = resolve_weights_source(
        (nitro.checkpoint_run or "legacy", choice),
        nitro.run_dir,
        ckpt,
        "restore_best",
        allow_short=True,
    )
    assert isinstance(source, AverageSource)
    short = short_average_message(choice, len(source.picks), "restore_best")
    if short is not None:
        warnings.warn(short, NitroWarning, stacklevel=4)
        return None
    return source.load(), None


def refuse_after_restore_best(values: RunValues) -> None:
    if values.restored_best:
        raise ConfigError(RESTORED_BEST_REFUSAL)
