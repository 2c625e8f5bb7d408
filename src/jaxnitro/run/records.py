"""The checkpoint record a train() writes: its header, its trees, and the save.

Written at each epoch end, at a stop, and at the steps `checkpoint_every_n_steps`
places inside an epoch, in the Checkpointing phase, from the run's `TrainState`:
its `held` says where an unfinished epoch stands (the record's `epoch_loss`), so a
resume continues it at its batch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from .._version import __version__
from ..checkpoint.derived import (
    HOST_PREFIX,
    derived_graphconst_record,
    derived_host_record,
)
from ..checkpoint.header import RecordHeader
from ..experiment.view import graphconst_record
from ..logging import protocol as logproto
from ..observe import phases

if TYPE_CHECKING:
    from ..observe.progress import Progress
    from .handle import Nitro
    from .parts import RunParts
    from .phase import RunPhase


def write_checkpoint(
    nitro: Nitro,
    run: RunParts,
    epoch: int,
    flat: dict[str, Any],
    reason: str | None,
) -> None:
    """Save the record of `epoch` as the run's state stands (its end, or a step
    inside it, where the state's `held` says how far the epoch got);
    `flat`: the validation metrics, flattened ({} when none ran there).
    The header's parameters are the handle's `params_to_log`; the rest is the
    run's parts."""
    ckpt = run.config.checkpointer
    if ckpt is None:
        return
    values, prepared = run.values, run.prepared
    e = values.experiment
    plan = prepared.plan
    assert plan is not None
    stopper = prepared.stopper
    host_arrays, host_values = derived_host_record(e, prepared.derived_keys)
    state = values.state
    held = state.held
    if held is not None and not held.is_at(state.epoch, state.step):
        held = None  # it spoke for an earlier step of the state, not this one
    header = RecordHeader(
        framework_version=__version__,
        experiment=f"{type(e).__module__}.{type(e).__qualname__}",
        epoch=epoch,
        step=state.step,
        seed=run.config.seed,
        preset=run.config.preset,
        graphconst=graphconst_record(e),
        config=nitro.params_to_log(),
        derived=tuple(prepared.derived_keys),
        derived_host=host_values,
        derived_graphconst=derived_graphconst_record(e, prepared.derived_keys),
        logger_type=_qualified(run.config.logger),
        logger_state=logproto.logger_state(run.config.logger),
        run_id=logproto.run_id(run.config.logger),
        run_url=logproto.run_url(run.config.logger),
        anchor_checksums=dict(prepared.anchor_sums),
        optimizer_layout=plan.state_layout(),
        early_stop=stopper.state()
        if callable(getattr(stopper, "state", None))
        else None,
        plateau={
            s.key: s.plateau.state() for s in plan.schedules if s.plateau is not None
        },
        # The running train loss of an epoch a stop cut (None when it ended), so
        # a resume that continues the epoch reports the whole epoch's mean.
        epoch_loss=None if held is None else held.to_json(),
        # The run started from these averaged weights (None: it did not).
        averaged_from=values.averaged_from,
        # What a resume compares: the hooks' code and the train data's shape.
        hook_fingerprints=dict(prepared.hook_prints),
        data_signature=_json_copy(prepared.data_signature),
    )
    trees = {
        "params": state.params,
        "state": state.model_state,
        "opt_state": state.opt_state,
        "device": values.device_values,
        HOST_PREFIX: host_arrays,
    }
    if state.ema is not None:
        trees["ema"] = state.ema
    scalars = {k: v for k, v in flat.items() if np.ndim(v) == 0}
    # A large record takes seconds to write: the progress line says so meanwhile,
    # and monitors see the Checkpointing phase.
    _save(
        run.phase,
        lambda: ckpt.save(
            epoch=epoch,
            step=state.step,
            metrics=scalars,
            trees=trees,
            header=header,
            stop_reason=reason,
        ),
    )


def _save(phase: RunPhase, save: Any) -> None:
    """Run `save` in the Checkpointing phase, the progress line saying so."""
    progress: Progress | None = phase.progress()
    if progress is not None:
        progress.phase("writing checkpoint")
    try:
        with checkpointing_phase(phase):
            save()
    finally:
        if progress is not None:
            progress.phase("")


@contextlib.contextmanager
def checkpointing_phase(phase: RunPhase) -> Iterator[None]:
    """Hold the handle in the Checkpointing phase while a record is written.

    Afterwards the handle goes back to the phase it came from: published again
    when that was TrainStepping (training goes on, and a watchdog must not read
    the rest of the epoch as a write), else restored without publishing. A write
    that raises restores it unpublished: the run's Failed comes next.
    """
    previous = phase.phase
    phase.set_phase(phases.Checkpointing())
    try:
        yield
    except BaseException:
        phase.restore_phase(previous)
        raise
    if isinstance(previous, phases.TrainStepping):
        phase.set_phase(previous)
    else:
        phase.restore_phase(previous)


def _json_copy(signature: Any) -> dict[str, Any] | None:
    """A data signature as a plain dict (the header's type), or None."""
    return None if signature is None else dict(signature)


def _qualified(obj: Any) -> str | None:
    if obj is None:
        return None
    return f"{type(obj).__module__}.{type(obj).__qualname__}"
