"""`RunValues`: what a run holds that changes, and where its weights came from.

The latest `TrainState` (the loop and restore commit a new one, placed on the run's
mesh), the experiment with its live Device values (`set_device` and the Device
schedules replace them), the record whose optimizer state the next `train()`
restores, and the provenance of the weights (a record, a warm start, an average,
`restore_best`). The handle reads them for its public face (`Nitro.train_state`,
`Nitro.experiment`, ...); each is written through one method here.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from ..checkpoint.record import CheckpointRecord
from ..errors import ConfigError
from ..experiment.view import replace_fields
from ..loop.prepared import Prepared
from ..loop.state import TrainState
from ..optim.plan import scheduled_devices


class RunValues:
    """The run's changing values, owned by its handle.

    Args:
        prepared: what setup fixed (the placement, the Device schedules).
        state: the training state setup built, restored or resumed.
        experiment: the experiment after derive and the Device conversion.
        device_values: its Device fields, as the dict every program receives.
        pending_record: the record whose optimizer state `train()` restores.
        checkpoint_source: the record file the weights came from, if one.
        weights_from: what a live handle given as weights= was, if one.
        averaged_from: what an averaged weights source averaged, if one.
    """

    def __init__(
        self,
        prepared: Prepared,
        state: TrainState,
        experiment: Any,
        device_values: dict[str, Any],
        *,
        pending_record: CheckpointRecord | None = None,
        checkpoint_source: str | None = None,
        weights_from: dict[str, Any] | None = None,
        averaged_from: dict[str, Any] | None = None,
    ) -> None:
        self._prepared = prepared
        self._state: TrainState | None = state
        self._experiment = experiment
        self._device_values = device_values
        self._pending = pending_record
        self._checkpoint_source = checkpoint_source
        self._weights_from = weights_from
        self._averaged_from = averaged_from
        self._restored_best = False

    # ------------------------------------------------------------ the state -------
    @property
    def state(self) -> TrainState:
        """The run's latest `TrainState`."""
        if self._state is None:
            raise ConfigError("The handle's setup did not finish: it holds no state.")
        return self._state

    def commit(self, state: TrainState) -> None:
        """Hold `state` as the run's latest (the loop and restore hand it back).

        The state it replaces may hold buffers a step donated: it is dropped. On
        a mesh it is placed as the programs expect (a value already there is kept).
        """
        self._state = state.placed(self._prepared.ctx.placement)

    @property
    def pending_record(self) -> CheckpointRecord | None:
        """The record whose optimizer state `train()` restores (a resume, or
        `restore_optimizer=True`); None once placed."""
        return self._pending

    def take_pending_record(self) -> CheckpointRecord | None:
        """The record whose optimizer state `train()` restores, handed over once."""
        record, self._pending = self._pending, None
        return record

    # ------------------------------------------------------ the Device fields -------
    @property
    def experiment(self) -> Any:
        """The experiment with the live Device values."""
        return self._experiment

    @property
    def device_values(self) -> dict[str, Any]:
        """The Device fields as the dict every program receives."""
        return self._device_values

    def set_devices(self, updates: dict[str, Any]) -> None:
        """Replace Device fields with the device arrays `updates` holds."""
        self._experiment = replace_fields(self._experiment, **updates)
        self._device_values = {**self._device_values, **updates}

    def sync_scheduled_devices(self) -> None:
        """Write the scheduled Device fields' current values into the experiment,
        so evaluation between epochs sees what training last used."""
        prepared = self._prepared
        if not prepared.device_schedules:
            return
        assert prepared.plan is not None
        current = prepared.plan.schedule_values(max(self.state.step - 1, 0))
        self.set_devices(
            scheduled_devices(current, prepared.device_schedules, jnp.asarray)
        )

    # ---------------------------------------------------------- provenance -------
    @property
    def checkpoint_source(self) -> str | None:
        """The record file the weights came from, if one."""
        return self._checkpoint_source

    @property
    def weights_from(self) -> dict[str, Any] | None:
        """What a live handle given as `weights=` was, if one."""
        return self._weights_from

    @property
    def averaged_from(self) -> dict[str, Any] | None:
        """What an averaged weights source (or `restore_best=Average`) averaged."""
        return self._averaged_from

    @property
    def restored_best(self) -> bool:
        """`restore_best` replaced the trained weights: the run trains no further."""
        return self._restored_best

    def restore_best(
        self,
        state: TrainState,
        source: str | None,
        averaged_from: dict[str, Any] | None,
    ) -> None:
        """Hold the weights `restore_best` loaded, from `source` (a record file,
        None for an average, whose `averaged_from` says what it averaged)."""
        self.commit(state)
        self._checkpoint_source = source
        if source is None:
            self._averaged_from = averaged_from
        self._restored_best = True
