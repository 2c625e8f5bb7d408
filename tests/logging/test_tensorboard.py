"""TensorBoardLogger: tensorboardX writes, tensorboard's EventAccumulator reads; it
resumes into the same logged run through logger_state/reattach, by hand and through a
resumed Nitro.
"""

import os
import sys

import numpy as np
import pytest
from experiments import TinyMetrics, TinyTrainAcc

import jaxnitro as nx
from jaxnitro.errors import MissingExtraError
from jaxnitro.logging.tensorboard import TensorBoardLogger


@pytest.fixture
def tb():
    """The tensorboard reader: EventAccumulator plus text decoding."""
    pytest.importorskip("tensorboardX")
    accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator"
    )
    from tensorboard.util import tensor_util

    class Reader:
        def __init__(self, logdir):
            self.ea = accumulator.EventAccumulator(
                str(logdir), size_guidance={"scalars": 0, "tensors": 0}
            )
            self.ea.Reload()

        def scalars(self, tag):
            return [(e.step, e.value) for e in self.ea.Scalars(tag)]

        def texts(self, tag):
            return [
                (e.step, tensor_util.make_ndarray(e.tensor_proto).item().decode())
                for e in self.ea.Tensors(tag + "/text_summary")
            ]

        def hparams(self):
            from tensorboard.plugins.hparams import plugin_data_pb2

            metadata = self.ea.SummaryMetadata("_hparams_/session_start_info")
            data = plugin_data_pb2.HParamsPluginData.FromString(
                metadata.plugin_data.content
            )
            return {
                k: v.WhichOneof("kind") and getattr(v, v.WhichOneof("kind"))
                for k, v in data.session_start_info.hparams.items()
            }

    return Reader


def test_tensorboard_logger_writes_what_tensorboard_reads(tb, tmp_path):
    lg = TensorBoardLogger(tmp_path / "tb")
    lg.log_params({"lr": 0.1, "adam": {"b1": 0.9}, "name": "x", "shape": (2, 3)})
    lg.log_other("binding_report", "max_epochs  3  from field\nseed  42  default")
    for step in (1, 2, 3):
        lg.log_metrics({"loss": 1.0 / step}, step=step, epoch=1, context="train")
    confusion = np.array([[3, 1], [0, 4]])
    lg.log_metrics(
        {"acc": np.float32(0.875), "confusion": confusion},
        step=3,
        epoch=1,
        context="validate",
    )
    lg.log_tags(["baseline", "cpu"])
    lg.log_confusion(confusion, ["cat", "dog"], epoch=1)
    lg.finish("completed")

    r = tb(tmp_path / "tb")
    assert r.scalars("train/loss") == [
        (1, 1.0),
        (2, pytest.approx(0.5)),
        (3, pytest.approx(1 / 3)),
    ]
    assert r.scalars("validate/acc") == [(3, 0.875)]
    assert r.hparams() == {
        "lr": 0.1,
        "adam/b1": 0.9,
        "name": "x",
        "shape": "(2, 3)",
    }
    ((step, params),) = r.texts("params")
    assert step == 0 and params.splitlines()[3] == "| adam/b1 | 0.9 |"
    assert r.texts("binding_report") == [
        (0, "    max_epochs  3  from field\n    seed  42  default")
    ]
    ((step, table),) = r.texts("confusion")
    assert step == 3 and "Epoch 1" in table and "| **cat** | 3 | 1 |" in table
    assert r.texts("validate/confusion") == [(3, "[[3, 1], [0, 4]]")]  # the metric
    assert r.texts("tags") == [(3, "- baseline\n- cpu")]
    assert r.texts("status") == [(3, "completed")]


def test_tensorboard_reattach_continues_the_directory_and_hides_later_steps(
    tb, tmp_path
):
    first = TensorBoardLogger()
    first.bind_run_dir(str(tmp_path / "run"))
    for step in range(1, 9):
        first.log_metrics({"loss": 1.0}, step=step, epoch=1, context="train")
        if step == 4:
            state = first.logger_state()  # what the checkpoint at step 4 records
    first.close()  # the process dies after step 8
    assert state == {"logdir": str(tmp_path / "run" / "tensorboard"), "step": 4}

    resumed = TensorBoardLogger()
    resumed.reattach(state)
    assert resumed.logdir == state["logdir"]
    for step in range(5, 9):
        resumed.log_metrics({"loss": 2.0}, step=step, epoch=2, context="train")
    resumed.finish("completed")

    assert len(os.listdir(state["logdir"])) == 2  # one run, two event files
    values = dict(tb(state["logdir"]).scalars("train/loss"))
    assert sorted(values) == list(range(1, 9))
    assert [values[s] for s in range(1, 9)] == [1.0] * 4 + [2.0] * 4


def test_tensorboard_an_explicit_logdir_wins_over_the_recorded_one(tmp_path):
    lg = TensorBoardLogger(tmp_path / "mine")
    lg.reattach({"logdir": str(tmp_path / "theirs"), "step": 3})
    assert lg.logdir == str(tmp_path / "mine")
    assert lg.logger_state() == {"logdir": str(tmp_path / "mine"), "step": 3}


def test_tensorboard_through_a_resumed_nitro_is_one_run(tb, tmp_path):
    run_dir = str(tmp_path / "run")
    first = nx.Nitro(
        TinyMetrics(max_epochs=2),
        run_dir=run_dir,
        logger=TensorBoardLogger(),
        log_every_n_steps=1,
    )
    first.train()
    resumed = nx.Nitro(
        TinyMetrics(max_epochs=3),
        run_dir=run_dir,
        logger=TensorBoardLogger(),
        resume="auto",
        log_every_n_steps=1,
    )
    resumed.train()
    logdir = os.path.join(run_dir, "tensorboard")
    assert resumed.logger_info == {
        "logdir": logdir,
        "view": f"tensorboard --logdir {logdir}",
    }
    r = tb(logdir)
    assert [s for s, _ in r.scalars("train/loss")] == list(range(1, 13))
    assert [s for s, _ in r.scalars("validate/acc")] == [4, 8, 12]
    assert r.texts("status") == [(8, "completed"), (12, "completed")]
    assert [s for s, _ in r.texts("validate/confusion")] == [4, 8, 12]


def test_tensorboard_gets_every_epochs_train_summary_whatever_the_cadence(tb, tmp_path):
    # 4 steps an epoch under the default 50: no train/ scalar, one summary an epoch
    nitro = nx.Nitro(
        TinyTrainAcc(max_epochs=2),
        run_dir=str(tmp_path),
        logger=TensorBoardLogger(),
        checkpointer=None,
    )
    nitro.train()
    r = tb(tmp_path / "tensorboard")
    assert not [t for t in r.ea.Tags()["scalars"] if t.startswith("train/")]
    losses = r.scalars("train_epoch/loss")
    assert [s for s, _ in losses] == [4, 8]
    assert [v for _, v in losses] == pytest.approx(
        [row["train_loss"] for row in nitro.history], rel=1e-6
    )
    assert [s for s, _ in r.scalars("train_epoch/train_acc")] == [4, 8]


def test_tensorboard_backend_is_the_summary_writer(tmp_path):
    tensorboardX = pytest.importorskip("tensorboardX")
    lg = TensorBoardLogger(tmp_path)
    writer = nx.backend(lg)
    assert isinstance(writer, tensorboardX.SummaryWriter) and lg.backend() is writer
    writer.add_histogram("weights", np.arange(10.0), 0)
    lg.close()
    assert nx.run_id(lg) == str(tmp_path) and nx.run_url(lg) is None
    assert repr(lg) == f"TensorBoardLogger({str(tmp_path)!r})"


def test_tensorboard_refusals(tmp_path, monkeypatch):
    with pytest.raises(nx.ConfigError, match="TensorBoardLogger has no log directory"):
        TensorBoardLogger().log_other("k", "v")
    assert TensorBoardLogger().logger_state() is None
    with pytest.raises(nx.ConfigError, match=r"reattach needs .* got \{'path': 'x'\}"):
        TensorBoardLogger().reattach({"path": "x"})
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    with pytest.raises(
        MissingExtraError,
        match=r"TensorBoardLogger needs the `tensorboardX` package.*"
        r"jaxnitro\[tensorboard\]",
    ):
        TensorBoardLogger(tmp_path).backend()
