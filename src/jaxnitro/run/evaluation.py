"""`RunEvaluation`: what an evaluation pass reads and writes of a run
(`loop.context.EvalHost`), built from the handle's parts rather than the handle.

`validate`, `evaluate`, `predict`, `render` and the training loop's validations run
`loop/evaluate.py` on it: the settings, the prepared programs and the data, the
weights the run evaluates (`TrainState.eval_params`), its phase and progress line,
its stop, and the eval programs' batch width, which setup's probe fixes (else the
first pass or prediction) and which then stays.
"""

from __future__ import annotations

from typing import Any

from ..compile.executables import Executables
from ..loop.prepared import Prepared
from ..observe import phases
from ..observe.progress import Progress
from .config import RunConfig
from .phase import RunPhase
from .stops import StopControl
from .values import RunValues


class RunEvaluation:
    """One handle's evaluation host (`EvalHost`).

    Args:
        config: the run's settings.
        prepared: what setup fixed.
        data: the handle's splits.
        executables: the handle's compiled programs.
        values: the run's state and Device values.
        phase: the run's phase and progress line.
        stops: the run's stop control.
        eval_width: the width setup's probe fixed, or None.
    """

    def __init__(
        self,
        config: RunConfig,
        prepared: Prepared,
        data: dict[str, Any],
        executables: Executables,
        values: RunValues,
        phase: RunPhase,
        stops: StopControl,
        eval_width: int | None,
    ) -> None:
        self._config = config
        self._prepared = prepared
        self.data = data
        self.executables = executables
        self._values = values
        self._phase = phase
        self._stops = stops
        self.eval_width = eval_width
        """The eval programs' batch width, once fixed."""

    @property
    def config(self) -> RunConfig:
        return self._config

    @property
    def prepared(self) -> Prepared:
        return self._prepared

    @property
    def stops(self) -> StopControl:
        return self._stops

    @property
    def experiment(self) -> Any:
        return self._values.experiment

    @property
    def states(self) -> Any:
        return self._values.state.model_state

    @property
    def current_epoch(self) -> int:
        return self._values.state.epoch

    @property
    def phase(self) -> phases.Phase:
        return self._phase.phase

    def device_values(self) -> dict[str, Any]:
        return self._values.device_values

    def eval_params(self) -> Any:
        return self._values.state.eval_params(self._config.eval_weights)

    def set_phase(self, phase: phases.Phase, **info: Any) -> None:
        self._phase.set_phase(phase, **info)

    def restore_phase(self, phase: phases.Phase, **info: Any) -> None:
        self._phase.restore_phase(phase, **info)

    def progress(self) -> Progress | None:
        return self._phase.progress()
