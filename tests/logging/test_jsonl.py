"""The JSON-lines default logger, and what a run logs through it."""

import json
import os

import numpy as np
import pytest
from experiments import Tiny

import jaxnitro as nx


def read_lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f.read().splitlines()]


def test_default_logger_writes_runs_exp_metrics_jsonl():
    nitro = nx.Nitro(Tiny(max_epochs=2), checkpointer=None)
    path = os.path.join("runs", "Tiny", "metrics.jsonl")
    assert nitro.run_dir == os.path.join("runs", "Tiny")
    assert nitro.logger_info == nx.logger_info(nitro) == {"path": path}
    nitro.train()
    lines = read_lines(path)
    assert lines[0]["type"] == "params"
    params = lines[0]
    assert (params["width"], params["smoothing"], params["seed"]) == (16, 0.0, 42)
    assert (params["accum"], params["max_epochs"]) == (1, 2)
    # the resolved prefetch settings (a list of batches: one producer, nothing to
    # spread)
    assert params["prefetch_path"] == "materialized"
    assert params["prefetch_workers"] == 1 and params["prefetch_ordered"] is True
    assert lines[1]["type"] == "other" and lines[1]["key"] == "binding_report"
    assert "max_epochs" in lines[1]["value"] and "from field" in lines[1]["value"]
    train = [x for x in lines if x.get("context") == "train"]
    assert [(x["epoch"], x["step"]) for x in train] == [
        (1, 1),
        (1, 2),
        (1, 3),
        (1, 4),
        (2, 5),
        (2, 6),
        (2, 7),
        (2, 8),
    ]
    validate = [x for x in lines if x.get("context") == "validate"]
    assert [(x["epoch"], x["step"]) for x in validate] == [(1, 4), (2, 8)]
    assert validate[-1]["loss"] == pytest.approx(nitro.history[-1]["loss"])
    assert lines[-1] == {"type": "finish", "status": "completed"}


def test_log_every_n_steps_thins_only_the_train_lines(tmp_path):
    nx.Nitro(
        Tiny(max_epochs=2),
        run_dir=str(tmp_path),
        log_every_n_steps=3,
        checkpointer=None,
    ).train()
    lines = read_lines(tmp_path / "metrics.jsonl")
    assert [x["step"] for x in lines if x.get("context") == "train"] == [3, 6]
    assert len([x for x in lines if x.get("context") == "validate"]) == 2


class HostTrainMetrics(Tiny):
    calls: list = nx.field(default_factory=list)  # Host: one entry per call

    def train_metrics(self, logits, *, y):
        self.calls.append(len(y))
        return {"call": len(self.calls)}

    def metrics_residency(self, hook):
        return "host"


def test_host_train_metrics_run_every_micro_batch_when_lines_are_thinned(tmp_path):
    nitro = nx.Nitro(
        HostTrainMetrics(max_epochs=1),
        run_dir=str(tmp_path),
        accum=2,
        log_every_n_steps=2,
        checkpointer=None,
    )
    nitro.train()
    assert nitro.experiment.calls == [16] * 4  # 4 micro-batches, 2 steps
    train = [x for x in read_lines(tmp_path / "metrics.jsonl") if "call" in x]
    # The one line written carries its step's last micro-batch's values.
    assert [(x["step"], x["call"]) for x in train] == [(2, 4)]


def test_logger_none_writes_nothing(tmp_path):
    nx.Nitro(
        Tiny(max_epochs=1), run_dir=str(tmp_path), logger=None, checkpointer=None
    ).train()
    assert os.listdir(tmp_path) == []


def test_a_logger_accessor_is_called_once_per_construction(tmp_path):
    made = []

    class Logged(Tiny):
        def logger(self):
            made.append(1)
            return nx.JSONLogger(str(tmp_path / "custom.jsonl"))

    nitro = nx.Nitro(Logged(max_epochs=1), checkpointer=None)
    nitro.train()
    nitro.validate()
    assert made == [1]
    assert read_lines(tmp_path / "custom.jsonl")[-1]["status"] == "completed"


def test_json_logger_appends_and_flushes_per_line(tmp_path):
    path = tmp_path / "m.jsonl"
    first = nx.JSONLogger(path)
    first.log_other("note", "a")
    assert read_lines(path) == [
        {"type": "other", "key": "note", "value": "a"}
    ]  # flushed
    first.finish("completed")
    second = nx.JSONLogger(path)
    second.log_tags(["x"])
    second.log_confusion([[1, 0], [0, 1]], ["a", "b"], epoch=3)
    second.finish("error")
    assert [x["type"] for x in read_lines(path)] == [
        "other",
        "finish",
        "tags",
        "confusion",
        "finish",
    ]


def test_json_logger_writes_strict_json_for_non_finite_array_elements(tmp_path):
    path = tmp_path / "m.jsonl"
    logger = nx.JSONLogger(path)
    logger.log_metrics(
        {"per_class": np.array([0.5, np.nan, np.inf])},
        step=1,
        epoch=1,
        context="validate",
    )
    logger.finish("completed")
    text = path.read_text().splitlines()[0]
    line = json.loads(text, parse_constant=lambda token: pytest.fail(token))
    assert line["per_class"] == [0.5, None, None]


class Keyed(Tiny):
    type: str = "mlp"  # a config field named like the line's own key


def test_json_logger_refuses_a_metric_or_param_named_like_a_line_key(tmp_path):
    logger = nx.JSONLogger(tmp_path / "m.jsonl")
    for key in ("type", "context", "epoch", "step"):
        with pytest.raises(
            nx.ConfigError,
            match=f'context "train" is named `{key}`, a key JSONLogger\'s metrics '
            f"lines keep for themselves \\(type, context, epoch, step\\).* Rename the "
            f"metric",
        ):
            logger.log_metrics({key: 0.5}, step=1, epoch=1, context="train")
    with pytest.raises(
        nx.ConfigError, match="parameter `type` \\('mlp'\\) has the name of the key"
    ):
        logger.log_params({"type": "mlp"})
    assert not (tmp_path / "m.jsonl").exists()  # nothing half-written
    with pytest.raises(nx.ConfigError, match="Rename the experiment field"):
        nx.Nitro(Keyed(), run_dir=str(tmp_path), checkpointer=None)  # at setup
    nx.Nitro(Keyed(), logger=None, checkpointer=None)  # only the JSON line clashes


class Logged(Tiny):
    widths: nx.GraphConst[tuple] = ((8, 4), 2)
    weights: nx.Device[np.ndarray] = nx.field(
        default_factory=lambda: np.ones(3, np.float32)
    )
    images: np.ndarray = nx.field(
        default_factory=lambda: np.zeros((100, 8), np.float32)
    )
    names: list = nx.field(default_factory=lambda: ["a", "b"])
    scale: np.float32 = nx.field(default_factory=lambda: np.float32(0.5))


def params_line(tmp_path):
    nx.Nitro(Logged(), run_dir=str(tmp_path), checkpointer=None)
    return read_lines(tmp_path / "metrics.jsonl")[0]


def test_params_line_logs_non_scalar_graphconst_and_device_fields_by_type(tmp_path):
    params = params_line(tmp_path)
    assert params["widths"] == "tuple"  # the spec's rule: a non-scalar logs its type
    assert params["weights"] == "float32[3] on device"  # Device: type and size


def test_params_line_leaves_out_non_scalar_host_values(tmp_path):
    params = params_line(tmp_path)
    assert "images" not in params and "names" not in params
    assert params["scale"] == 0.5 and params["n_train"] == 64  # scalars are logged
