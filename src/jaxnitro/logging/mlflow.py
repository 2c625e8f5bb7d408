"""`MLflowLogger`: an MLflow run, written through `MlflowClient` (no global state).

Needs the `mlflow` extra (`pip install 'jaxnitro[mlflow]'`, which installs
`mlflow-skinny`); mlflow is imported when the logger first talks to its store. The
logger never calls `mlflow.start_run` or `mlflow.set_tracking_uri`, so it leaves the
process's fluent MLflow state alone and two loggers can write two runs side by side.

Stores: an `http(s)://` tracking server; a `file:` directory, which MLflow 3 refuses
unless `MLFLOW_ALLOW_FILE_STORE=true` is set; a `sqlite:///path.db` database, which
needs `sqlalchemy` and `alembic` beside mlflow-skinny (the full `mlflow` package has
them). `tracking_uri=None` follows MLflow's own resolution (`MLFLOW_TRACKING_URI`).

What each verb writes, with the optimizer step as the metric step:

    log_metrics   a metric per number, keyed "<context>/<name>" ("train/loss",
                  "train_epoch/loss", the epoch's mean, "validate/acc"); another
                  value as a JSON artifact
                  "<context>/<name>/step-<step>.json"
    log_params    params, flattened with "/"; a value that differs from the one a
                  resumed run logged first (params are immutable in MLflow) becomes
                  the tag "resumed_param/<name>"
    log_other     an artifact "<key>.txt" (text) or "<key>.json"
    log_tags      run tags
    log_confusion an artifact "confusion/epoch-<epoch>.json" with labels and matrix
    finish        the tag "stop_reason", then the run ends FINISHED (completed,
                  early_stop), KILLED (requested, preempted) or FAILED (error)

A resumed run continues the same MLflow run: `logger_state` is `{"tracking_uri",
"run_id", "experiment_id"}` and `reattach` sets that run RUNNING again. MLflow keeps
every logged point, so steps a crashed process logged past its checkpoint stay in the
metric history beside the resumed run's.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError
from ..extras import require
from .values import as_scalar, flatten, jsonable

STORE_FAILED = (
    "MLflowLogger could not open the tracking store {uri!r}: {error} For a local "
    "store use tracking_uri='file:<dir>' with MLFLOW_ALLOW_FILE_STORE=true set, or "
    "'sqlite:///<file>.db' with sqlalchemy and alembic installed (the full mlflow "
    "package has them); or point tracking_uri at a tracking server."
)
BAD_STATE = (
    "MLflowLogger.reattach needs the state logger_state() returned, a dict with "
    "'tracking_uri', 'run_id' and 'experiment_id'; got {value!r}. Resume with the "
    "logger type that wrote the checkpoint, or start a new logged run with weights= "
    "instead of resume=."
)
OTHER_STORE = (
    "MLflowLogger was given tracking_uri={mine!r}, but the run being resumed, "
    "{run_id}, was logged to {theirs!r}. Pass tracking_uri={theirs!r} (or None) to "
    "continue that run, or start a new logged run with weights= instead of resume=."
)
RUN_GONE = (
    "MLflowLogger cannot resume MLflow run {run_id}: the store {uri!r} does not have "
    "it ({error}). Point tracking_uri at the store that holds it, or start a new "
    "logged run with weights= instead of resume=."
)
END_STATUS = {
    "completed": "FINISHED",
    "early_stop": "FINISHED",
    "requested": "KILLED",
    "preempted": "KILLED",
    "error": "FAILED",
}
"""The MLflow run status each stop reason ends a run with."""
_MAX_PARAM = 6000  # MLflow's limit on a param value's length
_BAD_KEY_CHARS = re.compile(r"[^\w./\- :]")


def mlflow_key(name: str) -> str:
    """`name` with the characters MLflow refuses in keys replaced by "_".

    Examples:
        >>> mlflow_key("validate/acc@5"), mlflow_key("/a//b/")
        ('validate/acc_5', 'a/b')
    """
    key = _BAD_KEY_CHARS.sub("_", name)
    return "/".join(part for part in key.split("/") if part not in ("", ".", ".."))


class MLflowLogger:
    """Logs one MLflow run through an `MlflowClient`.

    Args:
        tracking_uri: the store; None follows MLflow's resolution.
        experiment_name: the MLflow experiment, created when missing; None lets setup
            name it after the run directory (`runs/MyExp` gives `MyExp`), else
            "Default".
        run_name: the run's display name; None lets MLflow choose one.
        tags: tags set when the run is created.

    The run is created by the first verb that writes, so a logger that setup reattaches
    to a recorded run never creates a stray one.

    Examples:
        >>> lg = MLflowLogger("file:/tmp/mlruns", experiment_name="digits")
        >>> lg.logger_info()["experiment_name"], lg.logger_state()
        ('digits', None)
    """

    def __init__(
        self,
        tracking_uri: str | None = None,
        *,
        experiment_name: str | None = None,
        run_name: str | None = None,
        tags: Mapping[str, Any] | None = None,
    ) -> None:
        self.tracking_uri = tracking_uri
        self.experiment_name = experiment_name
        self.run_name = run_name
        self.tags = dict(tags or {})
        self._explicit_uri = tracking_uri is not None
        self._client: Any = None
        self._run_id: str | None = None
        self._experiment_id: str | None = None

    def bind_run_dir(self, run_dir: str) -> None:
        """Name an unnamed experiment after the run directory (done at setup)."""
        if self.experiment_name is None:
            name = run_dir.rstrip("/\\").replace("\\", "/").rsplit("/", 1)[-1]
            self.experiment_name = name or None

    def backend(self) -> Any:
        """The `MlflowClient`; pass `run_id()` to its calls (artifacts, figures...)."""
        if self._client is None:
            tracking = require(
                "mlflow.tracking", extra="mlflow", feature="MLflowLogger"
            )
            try:
                self._client = tracking.MlflowClient(tracking_uri=self.tracking_uri)
            except Exception as error:
                raise ConfigError(
                    STORE_FAILED.format(uri=self.tracking_uri, error=error)
                ) from error
            self.tracking_uri = self._client.tracking_uri
        return self._client

    def _run(self) -> str:
        if self._run_id is None:
            client = self.backend()
            name = self.experiment_name or "Default"
            experiment = client.get_experiment_by_name(name)
            experiment_id = (
                experiment.experiment_id
                if experiment is not None
                else client.create_experiment(name)
            )
            tags = {mlflow_key(k): str(v) for k, v in self.tags.items()}
            run = client.create_run(experiment_id, run_name=self.run_name, tags=tags)
            self._experiment_id = experiment_id
            self._run_id = run.info.run_id
            self.run_name = run.info.run_name
        return self._run_id

    def _artifact(self, value: Any, path: str) -> None:
        run_id = self._run()
        if isinstance(value, str) and path.endswith(".txt"):
            self.backend().log_text(run_id, value, path)
        else:
            self.backend().log_dict(run_id, jsonable(value), path)

    # ------------------------------------------------------------ the verbs ------
    def log_metrics(
        self,
        metrics: dict[str, Any],
        *,
        step: int,
        epoch: int,
        context: str,
        **kwargs: Any,
    ) -> None:
        """Numbers as metrics "<context>/<name>" at `step`; others as JSON artifacts."""
        entities = require("mlflow.entities", extra="mlflow", feature="MLflowLogger")
        run_id = self._run()
        stamp = int(time.time() * 1000)
        points = []
        for name, value in metrics.items():
            key = mlflow_key(f"{context}/{name}")
            ok, plain = as_scalar(value)
            if ok and plain is not None:
                points.append(entities.Metric(key, float(plain), stamp, int(step)))
            else:
                self._artifact(value, f"{key}/step-{int(step):08d}.json")
        for start in range(0, len(points), 1000):
            self.backend().log_batch(run_id, metrics=points[start : start + 1000])

    def log_params(self, params: dict[str, Any]) -> None:
        """Params flattened with "/"; a changed value on a resumed run becomes a tag."""
        entities = require("mlflow.entities", extra="mlflow", feature="MLflowLogger")
        client = self.backend()
        run_id = self._run()
        logged = client.get_run(run_id).data.params
        new, changed = [], []
        for name, value in flatten(params).items():
            key = mlflow_key(name)
            ok, plain = as_scalar(value)
            text = str(plain if ok else jsonable(value))[:_MAX_PARAM]
            if key not in logged:
                new.append(entities.Param(key, text))
            elif logged[key] != text:
                changed.append(entities.RunTag(f"resumed_param/{key}", text))
        for start in range(0, len(new), 100):
            client.log_batch(run_id, params=new[start : start + 100])
        for start in range(0, len(changed), 100):
            client.log_batch(run_id, tags=changed[start : start + 100])

    def log_other(self, key: str, value: Any) -> None:
        """An artifact `<key>.txt` for text, `<key>.json` for anything else."""
        suffix = ".txt" if isinstance(value, str) else ".json"
        self._artifact(value, mlflow_key(key) + suffix)

    def log_tags(self, tags: Any) -> None:
        """Run tags: a mapping's items, or each name of a list with the value "true"."""
        if isinstance(tags, Mapping):
            items = [(str(k), str(v)) for k, v in tags.items()]
        else:
            names = [tags] if isinstance(tags, str) else list(tags)
            items = [(str(t), "true") for t in names]
        run_id = self._run()
        for key, value in items:
            self.backend().set_tag(run_id, mlflow_key(key), value)

    def log_confusion(self, matrix: Any, labels: Any, *, epoch: int) -> None:
        """An artifact "confusion/epoch-<epoch>.json" with the labels and matrix."""
        record = {"epoch": epoch, "labels": list(labels), "matrix": matrix}
        self._artifact(record, f"confusion/epoch-{int(epoch):04d}.json")

    def finish(self, status: str) -> None:
        """Tag the stop reason and end the run (see END_STATUS)."""
        run_id = self._run()
        client = self.backend()
        client.set_tag(run_id, "stop_reason", status)
        client.set_terminated(run_id, END_STATUS.get(status, "FINISHED"))

    # ------------------------------------------------------------ identity -------
    def run_id(self) -> str | None:
        """The MLflow run id (None until the first write creates the run)."""
        return self._run_id

    def run_url(self) -> str | None:
        """The run's page on a tracking server; None for a local store."""
        uri = self.tracking_uri or ""
        if self._run_id is None or not uri.startswith(("http://", "https://")):
            return None
        base = uri.rstrip("/")
        return f"{base}/#/experiments/{self._experiment_id}/runs/{self._run_id}"

    def logger_info(self) -> dict[str, Any]:
        """The store, the experiment and the run."""
        return {
            "tracking_uri": self.tracking_uri,
            "experiment_name": self.experiment_name,
            "experiment_id": self._experiment_id,
            "run_id": self._run_id,
            "run_name": self.run_name,
        }

    def logger_state(self) -> dict[str, Any] | None:
        """`{"tracking_uri", "run_id", "experiment_id"}`, or None before the run."""
        if self._run_id is None:
            return None
        return {
            "tracking_uri": self.tracking_uri,
            "run_id": self._run_id,
            "experiment_id": self._experiment_id,
        }

    def reattach(self, state: Any) -> None:
        """Continue the MLflow run `state` names, setting it RUNNING again."""
        if not isinstance(state, Mapping) or not all(
            isinstance(state.get(k), str)
            for k in ("tracking_uri", "run_id", "experiment_id")
        ):
            raise ConfigError(BAD_STATE.format(value=state))
        run_id, uri = state["run_id"], state["tracking_uri"]
        if self._explicit_uri and self.tracking_uri != uri:
            raise ConfigError(
                OTHER_STORE.format(mine=self.tracking_uri, run_id=run_id, theirs=uri)
            )
        if self.tracking_uri != uri:
            self.tracking_uri = uri
            self._client = None
        client = self.backend()
        try:
            run = client.get_run(run_id)
        except Exception as error:
            raise ConfigError(
                RUN_GONE.format(run_id=run_id, uri=uri, error=error)
            ) from error
        if run.info.status != "RUNNING":
            client.update_run(run_id, status="RUNNING")
        self._run_id = run_id
        self._experiment_id = state["experiment_id"]
        self.run_name = run.info.run_name
        self.experiment_name = client.get_experiment(self._experiment_id).name

    def __repr__(self) -> str:
        return (
            f"MLflowLogger({self.tracking_uri!r}, "
            f"experiment_name={self.experiment_name!r}, run_id={self._run_id!r})"
        )
