"""MLflowLogger, read back by a second MlflowClient from a local file store under
tmp_path (no network); it resumes into the same logged run through
logger_state/reattach, by hand and through a resumed Nitro.
"""

import json
import os
import sys

import numpy as np
import pytest
from experiments import TinyMetrics, TinyTrainAcc

import jaxnitro as nx
from jaxnitro.errors import MissingExtraError
from jaxnitro.logging.mlflow import MLflowLogger, mlflow_key


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A local MLflow file store under tmp_path, and a client that reads it."""
    tracking = pytest.importorskip("mlflow.tracking")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    return uri, tracking.MlflowClient(tracking_uri=uri)


def history(client, run_id, key):
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def test_mlflow_logger_writes_what_mlflow_client_reads(store, tmp_path):
    uri, client = store
    lg = MLflowLogger(uri, experiment_name="digits", run_name="r1", tags={"team": "a"})
    lg.log_params({"lr": 0.1, "adam": {"b1": 0.9}, "shape": (2, 3), "seed": 42})
    lg.log_other("binding_report", "max_epochs  3  from field")
    lg.log_other("sizes", {"train": 4})
    for step in (1, 2, 3):
        lg.log_metrics({"loss": 1.0 / step}, step=step, epoch=1, context="train")
    confusion = np.array([[3, 1], [0, 4]])
    lg.log_metrics(
        {"acc": np.float32(0.875), "top@5": 1.0, "confusion": confusion},
        step=3,
        epoch=1,
        context="validate",
    )
    lg.log_tags({"kind": "baseline"})
    lg.log_tags(["cpu"])
    lg.log_confusion(confusion, ["cat", "dog"], epoch=1)
    lg.finish("completed")

    run = client.get_run(lg.run_id())
    assert run.info.run_name == "r1" and run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == "digits"
    assert run.data.params == {
        "lr": "0.1",
        "adam/b1": "0.9",
        "shape": "[2, 3]",
        "seed": "42",
    }
    assert history(client, lg.run_id(), "train/loss") == [
        (1, 1.0),
        (2, 0.5),
        (3, pytest.approx(1 / 3)),
    ]
    assert history(client, lg.run_id(), "validate/acc") == [(3, 0.875)]
    assert history(client, lg.run_id(), "validate/top_5") == [(3, 1.0)]
    tags = run.data.tags
    assert (tags["team"], tags["kind"], tags["cpu"]) == ("a", "baseline", "true")
    assert tags["stop_reason"] == "completed"

    def artifact(path):
        local = client.download_artifacts(lg.run_id(), path, str(tmp_path))
        with open(local) as f:
            return f.read()

    assert artifact("binding_report.txt") == "max_epochs  3  from field"
    assert json.loads(artifact("sizes.json")) == {"train": 4}
    assert json.loads(artifact("confusion/epoch-0001.json")) == {
        "epoch": 1,
        "labels": ["cat", "dog"],
        "matrix": [[3, 1], [0, 4]],
    }
    metric_file = artifact("validate/confusion/step-00000003.json")
    assert json.loads(metric_file) == [[3, 1], [0, 4]]


def test_mlflow_reattach_continues_the_same_run(store):
    uri, client = store
    first = MLflowLogger(uri, experiment_name="e")
    first.log_params({"max_epochs": 2, "seed": 1})
    first.log_metrics({"loss": 1.0}, step=4, epoch=1, context="train")
    state = first.logger_state()
    first.finish("error")
    assert client.get_run(state["run_id"]).info.status == "FAILED"
    assert state == {
        "tracking_uri": uri,
        "run_id": first.run_id(),
        "experiment_id": first.logger_info()["experiment_id"],
    }

    resumed = MLflowLogger()  # no URI: the recorded one is used
    resumed.reattach(state)
    assert client.get_run(state["run_id"]).info.status == "RUNNING"
    assert resumed.logger_info()["experiment_name"] == "e"
    resumed.log_params({"max_epochs": 3, "seed": 1, "accum": 2})
    resumed.log_metrics({"loss": 0.5}, step=8, epoch=2, context="train")
    resumed.finish("requested")

    run = client.get_run(state["run_id"])
    assert run.info.status == "KILLED" and run.data.tags["stop_reason"] == "requested"
    assert run.data.params == {"max_epochs": "2", "seed": "1", "accum": "2"}
    assert run.data.tags["resumed_param/max_epochs"] == "3"
    assert history(client, state["run_id"], "train/loss") == [(4, 1.0), (8, 0.5)]
    assert len(client.search_runs([state["experiment_id"]])) == 1


def test_mlflow_through_a_resumed_nitro_is_one_run(store, tmp_path):
    uri, client = store
    run_dir = str(tmp_path / "Digits")
    first = nx.Nitro(
        TinyMetrics(max_epochs=2),
        run_dir=run_dir,
        logger=MLflowLogger(uri),
        log_every_n_steps=1,
    )
    first.train()
    resumed = nx.Nitro(
        TinyMetrics(max_epochs=3),
        run_dir=run_dir,
        logger=MLflowLogger(uri),
        resume="auto",
        log_every_n_steps=1,
    )
    resumed.train()
    run_id = resumed.logger.run_id()
    assert run_id == first.logger.run_id()
    assert resumed.logger_info["experiment_name"] == "Digits"
    assert [s for s, _ in history(client, run_id, "train/loss")] == list(range(1, 13))
    assert [s for s, _ in history(client, run_id, "validate/acc")] == [4, 8, 12]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["max_epochs"] == "2"
    assert run.data.tags["resumed_param/max_epochs"] == "3"
    paths = [a.path for a in client.list_artifacts(run_id, "validate/confusion")]
    assert len(paths) == 3
    record = nx.read_manifest(run_dir)[-1]
    info = nx.checkpoint_info(os.path.join(run_dir, record.file))
    assert info["run_id"] == run_id


def test_mlflow_gets_every_epochs_train_summary_whatever_the_cadence(store, tmp_path):
    # 4 steps an epoch under the default 50: no train/ metric, one summary an epoch
    uri, client = store
    nitro = nx.Nitro(
        TinyTrainAcc(max_epochs=2),
        run_dir=str(tmp_path / "Digits"),
        logger=MLflowLogger(uri),
        checkpointer=None,
    )
    nitro.train()
    run_id = nitro.logger.run_id()
    keys = set(client.get_run(run_id).data.metrics)
    assert not [k for k in keys if k.startswith("train/")]
    losses = history(client, run_id, "train_epoch/loss")
    assert [s for s, _ in losses] == [4, 8]
    assert [v for _, v in losses] == pytest.approx(
        [row["train_loss"] for row in nitro.history], rel=1e-6
    )
    assert [s for s, _ in history(client, run_id, "train_epoch/train_acc")] == [4, 8]


def test_mlflow_backend_is_the_client_and_urls_name_a_server(store):
    uri, _ = store
    tracking = pytest.importorskip("mlflow.tracking")
    lg = MLflowLogger(uri)
    assert isinstance(nx.backend(lg), tracking.MlflowClient)
    assert lg.logger_state() is None and lg.run_id() is None and lg.run_url() is None
    lg.log_tags(["x"])
    assert lg.run_id() is not None and lg.run_url() is None  # a local store
    assert lg.logger_info()["experiment_name"] is None  # "Default" in MLflow
    server = MLflowLogger("http://mlflow.internal:5000/")
    server._run_id, server._experiment_id = "abc", "7"
    assert server.run_url() == "http://mlflow.internal:5000/#/experiments/7/runs/abc"
    assert "MLflowLogger('http://mlflow.internal:5000/'" in repr(server)
    assert mlflow_key("train/acc@5") == "train/acc_5"


def test_mlflow_refusals(store, monkeypatch):
    uri, _ = store
    with pytest.raises(nx.ConfigError, match=r"reattach needs .* got 'run-1'"):
        MLflowLogger(uri).reattach("run-1")
    state = {"tracking_uri": uri, "run_id": "0" * 32, "experiment_id": "0"}
    with pytest.raises(
        nx.ConfigError, match=f"was given tracking_uri='file:/elsewhere'.*{uri}"
    ):
        MLflowLogger("file:/elsewhere").reattach(state)
    with pytest.raises(nx.ConfigError, match=r"cannot resume MLflow run 0{32}: the"):
        MLflowLogger(uri).reattach(state)
    with pytest.raises(nx.ConfigError, match="could not open the tracking store"):
        MLflowLogger("nosuchscheme://x").log_tags(["x"])
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")
    with pytest.raises(nx.ConfigError, match="MLFLOW_ALLOW_FILE_STORE=true"):
        MLflowLogger(uri + "-fresh").log_tags(["x"])  # mlflow caches opened stores
    monkeypatch.setitem(sys.modules, "mlflow.tracking", None)
    with pytest.raises(
        MissingExtraError, match=r"MLflowLogger needs the `mlflow\.tracking` package"
    ):
        MLflowLogger(uri).backend()
