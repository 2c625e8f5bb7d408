"""WandbLogger, in W&B's offline mode under tmp_path (no network): each process's
offline run file (`<dir>/wandb/offline-run-*/run-<id>.wandb`) is read back record by
record and the config, history rows, summary, tags and exit code are checked. A
resumed run keeps its W&B run id (a second offline file of the same run), by hand and
through a resumed Nitro.

The tests that start W&B runs need the `wandb` extra and are marked `wandb`: a plain
`pytest` leaves them out, `pytest -m wandb tests/logging` runs them (CI does, after
installing the extra). They do not skip when wandb is missing: in the wandb tier that
is a failure. The refusals need no wandb and run in the default tier.
"""

import glob
import json
import os
import struct
import sys
import time
import types

import numpy as np
import optax
import pytest
from experiments import TinyMetrics

import jaxnitro as nx
from jaxnitro.errors import MissingExtraError
from jaxnitro.logging.wandb import WandbLogger


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """W&B offline, quiet and local: its files, settings and cache under tmp_path."""
    for name in ("WANDB_API_KEY", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    env = {
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(tmp_path / "wandb-default"),
        "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
        "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"),
        "WANDB_DATA_DIR": str(tmp_path / "wandb-data"),
        "WANDB_SILENT": "true",
        "WANDB_CONSOLE": "off",  # leave pytest's capture of stdout alone
        "WANDB_DISABLE_CODE": "true",
        "WANDB_DISABLE_GIT": "true",
        "WANDB_X_DISABLE_STATS": "true",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return tmp_path


def read_records(path):
    """The protobuf records of a `.wandb` file: a 7-byte header (":W&B", a magic
    number, a version) then LevelDB's log format, 32 KiB blocks of chunks, each with
    a CRC, a length and a type (1 whole record, 2 first, 3 middle, 4 last part)."""
    from wandb.proto import wandb_internal_pb2

    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    records, parts, pos, block = [], b"", 7, 32768
    while pos + 7 <= len(data):
        left = block - pos % block
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if left < 7 or (kind == 0 and length == 0):  # a block's padding
            pos += left
            continue
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        parts = chunk if kind in (1, 2) else parts + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            records.append(record)
    return records


def finished_records(path, timeout=20.0):
    """The records of a finished run's file. `run.finish()` returns before W&B's
    service process has written the whole file (the exit record last): wait for it."""
    deadline = time.monotonic() + timeout
    while True:
        records = read_records(path)
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            return records
        assert time.monotonic() < deadline, f"{path} has no exit record"
        time.sleep(0.05)


class RunFile:
    """What one offline process wrote of a W&B run."""

    def __init__(self, path):
        self.path = path
        self.run = None
        self.config, self.summary, self.rows, self.exit_code = {}, {}, {}, None
        for record in finished_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                self.run = record.run
                self._update(self.config, record.run.config.update)
            elif kind == "config":
                self._update(self.config, record.config.update)
            elif kind == "summary":
                self._update(self.summary, record.summary.update)
            elif kind == "history":
                row = self.rows.setdefault(record.history.step.num, {})
                self._update(row, record.history.item)
            elif kind == "exit":
                self.exit_code = record.exit.exit_code
        self.config.pop("_wandb", None)

    @staticmethod
    def _update(into, items):
        for item in items:
            key = item.key or "/".join(item.nested_key)
            into[key] = json.loads(item.value_json)

    def series(self, key):
        return [(s, row[key]) for s, row in sorted(self.rows.items()) if key in row]

    def steps(self, key):
        return [s for s, _ in self.series(key)]


def run_files(directory, run_id):
    """The offline files of run `run_id` under `directory`, oldest first (the
    directory of a second process in the same second is named `<...>-<id>-1`)."""
    pattern = os.path.join(directory, "wandb", "offline-run-*", f"run-{run_id}.wandb")
    files = [RunFile(p) for p in glob.glob(pattern)]
    return sorted(files, key=lambda f: f.run.start_time.ToNanoseconds())


@pytest.mark.wandb
def test_wandb_logger_writes_what_the_offline_run_file_holds(offline):
    lg = WandbLogger(project="digits", dir=offline, name="r1", tags=["baseline"])
    lg.bind_run_id("3f2a9c1d")
    lg.log_params({"lr": 0.1, "adam": {"b1": 0.9}, "shape": (2, 3), "seed": 42})
    lg.log_other("binding_report", "max_epochs  3  from field\nseed  42  default")
    lg.log_other("sizes", {"train": 4})
    for step in (1, 2, 3):
        line = {"loss": 1.0 / step, "schedule/default/learning_rate": 0.1 * step}
        lg.log_metrics(line, step=step, epoch=1, context="train")
    confusion = np.array([[3, 1], [0, 4]])
    lg.log_metrics({"loss": 0.6}, step=3, epoch=1, context="train_epoch")
    lg.log_metrics(
        {"acc": np.float32(0.875), "confusion": confusion, "note": "ok"},
        step=3,
        epoch=1,
        context="validate",
    )
    lg.log_metrics({"data_wait_frac": 0.25}, step=3, epoch=1, context="data")
    lg.log_tags(["cpu"])
    lg.log_tags({"kind": "smoke"})
    lg.log_confusion(confusion, ["cat", "dog"], epoch=1)
    assert lg.logger_state() == {
        "run_id": "3f2a9c1d",
        "project": "digits",
        "entity": None,
    }
    lg.finish("completed")

    (f,) = run_files(offline, "3f2a9c1d")
    assert f.run.run_id == "3f2a9c1d" and f.run.project == "digits"
    assert f.run.display_name == "r1"
    assert list(f.run.tags) == ["baseline", "cpu", "kind:smoke"]
    assert f.config == {"lr": 0.1, "adam/b1": 0.9, "shape": [2, 3], "seed": 42}
    assert f.series("train/loss") == [
        (1, 1.0),
        (2, 0.5),
        (3, pytest.approx(1 / 3)),
    ]
    assert f.series("train/schedule/default/learning_rate") == [
        (1, 0.1),
        (2, 0.2),
        (3, pytest.approx(0.3)),
    ]
    row = f.rows[3]  # one history row a step: every context's values at step 3
    assert row["train_epoch/loss"] == 0.6 and row["data/data_wait_frac"] == 0.25
    assert row["validate/acc"] == 0.875 and row["validate/note"] == "ok"
    assert json.loads(row["validate/confusion"]) == [[3, 1], [0, 4]]
    assert row["confusion/_type"] == "table-file" and row["confusion/nrows"] == 2
    assert f.summary["binding_report"] == "max_epochs  3  from field\nseed  42  default"
    assert f.summary["sizes"] == {"train": 4}
    assert f.summary["stop_reason"] == "completed" and f.exit_code == 0
    assert sorted(f.rows) == [1, 2, 3]


@pytest.mark.wandb
def test_wandb_reattach_continues_the_same_run_id(offline):
    first = WandbLogger(dir=offline)
    first.bind_run_dir(str(offline / "Digits"))
    first.bind_run_id("0a1b2c3d")
    assert first.dir == str(offline)  # an explicit dir wins over the run directory
    first.log_params({"max_epochs": 2, "seed": 1})
    first.log_metrics({"loss": 1.0}, step=4, epoch=1, context="train")
    state = first.logger_state()
    first.finish("error")
    assert state == {"run_id": "0a1b2c3d", "project": "Digits", "entity": None}

    resumed = WandbLogger(dir=offline)  # no project: the recorded one is used
    resumed.reattach(state)
    assert resumed.run_id() == "0a1b2c3d" and resumed.project == "Digits"
    resumed.log_params({"max_epochs": 3, "seed": 1})
    resumed.log_metrics({"loss": 0.5}, step=8, epoch=2, context="train")
    resumed.finish("preempted")

    crashed, again = run_files(offline, "0a1b2c3d")  # one W&B run, two processes
    assert crashed.exit_code == 1 and crashed.summary["stop_reason"] == "error"
    assert crashed.series("train/loss") == [(4, 1.0)]
    assert again.run.run_id == "0a1b2c3d" and again.run.project == "Digits"
    assert again.series("train/loss") == [(8, 0.5)]
    assert again.exit_code == 0 and again.summary["stop_reason"] == "preempted"
    # Offline, a resumed process cannot read the config W&B holds, so it logs its
    # params as they are; online the changed one would be "resumed_param/max_epochs".
    assert again.config == {"max_epochs": 3, "seed": 1}


@pytest.mark.wandb
def test_wandb_through_a_resumed_nitro_is_one_run(offline):
    run_dir = str(offline / "Digits")

    def nitro(epochs, **kw):
        return nx.Nitro(
            TinyMetrics(max_epochs=epochs),
            run_dir=run_dir,
            logger=WandbLogger(),
            schedules={"learning_rate": optax.linear_schedule(0.05, 0.01, 12)},
            log_every_n_steps=1,
            **kw,
        )

    first = nitro(2)
    first.train()
    resumed = nitro(3, resume="auto")
    resumed.train()
    run_id = resumed.logger.run_id()
    assert run_id == first.logger.run_id() == resumed.checkpoint_run
    info = nx.checkpoint_info(os.path.join(run_dir, nx.read_manifest(run_dir)[-1].file))
    assert info["run_id"] == run_id
    assert resumed.logger_info["project"] == "Digits"
    assert resumed.logger_info["dir"] == run_dir  # W&B's files in the run directory
    assert resumed.logger_info["skipped_lines"] == 0

    two, three = run_files(run_dir, run_id)
    assert two.run.run_id == three.run.run_id == run_id
    assert two.steps("train/loss") == list(range(1, 9))
    assert three.steps("train/loss") == list(range(9, 13))
    lr = two.series("train/schedule/default/learning_rate")
    lr += three.series("train/schedule/default/learning_rate")
    expected = [float(optax.linear_schedule(0.05, 0.01, 12)(t)) for t in range(12)]
    np.testing.assert_allclose([v for _, v in lr], expected, rtol=1e-6)
    for key in ("validate/acc", "train_epoch/loss", "data/steps_per_sec"):
        assert two.steps(key) + three.steps(key) == [4, 8, 12], key
    losses = [v for _, v in two.series("train_epoch/loss")]
    losses += [v for _, v in three.series("train_epoch/loss")]
    history = [row["train_loss"] for row in (*first.history, *resumed.history)]
    assert losses == pytest.approx(history[-3:], rel=1e-6)
    confusion = json.loads(three.rows[12]["validate/confusion"])
    assert np.asarray(confusion).shape == (3, 3)
    assert two.config["max_epochs"] == 2 and three.config["max_epochs"] == 3
    report = two.summary["binding_report"]
    assert report.startswith("jaxnitro binding report for TinyMetrics\n")
    assert "max_epochs                2" in report
    assert two.exit_code == three.exit_code == 0
    assert two.summary["stop_reason"] == three.summary["stop_reason"] == "completed"


@pytest.mark.wandb
def test_wandb_skips_steps_the_run_already_holds(offline, monkeypatch):
    lg = WandbLogger(project="p", dir=offline)
    lg.bind_run_id("5e6f7a8b")
    lg.log_metrics({"loss": 1.0}, step=5, epoch=1, context="train")
    lg.log_metrics({"loss": 2.0}, step=4, epoch=1, context="train")  # W&B: ignored
    lg.log_metrics({"acc": 0.5}, step=5, epoch=1, context="validate")  # same row
    lg.finish("completed")
    assert lg.logger_info()["skipped_lines"] == 1
    (f,) = run_files(offline, "5e6f7a8b")
    assert f.rows[5]["train/loss"] == 1.0 and f.rows[5]["validate/acc"] == 0.5
    assert sorted(f.rows) == [5]

    # Online, a resumed run starts after the last step W&B holds: the lines a
    # crashed process logged past its checkpoint are trained again, and skipped.
    logged = []

    class Resumed:
        id, project, entity, name, url, dir = "5e6f7a8b", "p", "me", "r", None, None
        starting_step = 11  # W&B held steps up to 10

        def log(self, data, *, step):
            logged.append((step, data))

    fake = types.SimpleNamespace(init=lambda **kw: Resumed())
    monkeypatch.setitem(sys.modules, "wandb", fake)
    resumed = WandbLogger(project="p")
    resumed.reattach({"run_id": "5e6f7a8b", "project": "p", "entity": "me"})
    for step in range(9, 13):
        resumed.log_metrics({"loss": 0.1}, step=step, epoch=3, context="train")
    assert [s for s, _ in logged] == [11, 12]
    assert resumed.logger_info()["skipped_lines"] == 2


@pytest.mark.wandb
def test_wandb_disabled_mode_writes_nothing(offline):
    lg = WandbLogger(project="p", mode="disabled", dir=offline / "off")
    lg.bind_run_id("9d8c7b6a")
    lg.log_params({"lr": 0.1})
    lg.log_metrics({"loss": 1.0}, step=1, epoch=1, context="train")
    lg.log_confusion(np.eye(2), ["a", "b"], epoch=1)
    lg.finish("error")
    assert lg.run_id() == "9d8c7b6a" and lg.run_url() is None
    assert not glob.glob(str(offline / "off" / "wandb" / "*run-*"))


@pytest.mark.wandb
def test_wandb_backend_is_the_run(offline):
    import wandb

    lg = WandbLogger(project="p", dir=offline)
    assert lg.logger_state() is None and lg.run_id() is None
    run = nx.backend(lg)
    assert isinstance(run, wandb.Run) and lg.backend() is run
    assert wandb.run is None  # the logger leaves W&B's global run alone
    run.log({"weights": wandb.Histogram(np.arange(10.0))}, step=1)
    assert lg.run_id() == run.id and lg.run_url() is None  # offline: no page
    assert lg.logger_info()["files"] == os.path.dirname(run.dir)
    lg.finish("completed")
    assert repr(lg) == f"WandbLogger(project='p', run_id={run.id!r})"
    (f,) = run_files(offline, run.id)
    assert f.rows[1]["weights/_type"] == "histogram"


def test_wandb_refusals(monkeypatch):
    with pytest.raises(nx.ConfigError, match=r"mode='on'; mode must be one of"):
        WandbLogger(mode="on")
    with pytest.raises(nx.ConfigError, match=r"reattach needs .* got 'abc'"):
        WandbLogger().reattach("abc")
    with pytest.raises(nx.ConfigError, match=r"reattach needs .* got \{'project'"):
        WandbLogger().reattach({"project": "p"})
    state = {"run_id": "abc", "project": "theirs", "entity": "team"}
    with pytest.raises(
        nx.ConfigError,
        match=r"given project='mine', but the run being resumed, abc, was logged to "
        r"project='theirs'",
    ):
        WandbLogger("mine").reattach(state)
    with pytest.raises(nx.ConfigError, match=r"given entity='me'.*entity='team'"):
        WandbLogger(entity="me").reattach(state)
    lg = WandbLogger(tags="one")
    lg.bind_run_id("mine")
    lg.reattach(state)  # a branch's new run id: a new W&B run, the recorded project
    assert (lg.run_id(), lg.project, lg.entity, lg.tags) == (
        "mine",
        "theirs",
        "team",
        ["one"],
    )
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(
        MissingExtraError,
        match=r"WandbLogger needs the `wandb` package.*pip install 'jaxnitro\[wandb\]'",
    ):
        WandbLogger(project="p").log_tags(["x"])
