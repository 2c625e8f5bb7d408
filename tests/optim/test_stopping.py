"""Early stopping, and the watched metric it and Plateau read back from validation."""

import math
import re

import jax.numpy as jnp
import numpy as np
import pytest
from experiments import Tiny
from optim_reference import OneBatch, quiet

import jaxnitro as nx


def test_early_stopping_stops_validates_and_checkpoints(tmp_path):
    policy = nx.EarlyStopping(patience=1, min_delta=10.0)  # nothing improves by 10
    nitro = nx.Nitro(
        Tiny(max_epochs=10), early_stop=policy, run_dir=str(tmp_path), logger=None
    )
    nitro.train()
    assert nitro.stop_reason == "early_stop" and nitro.current_epoch == 2
    assert len(nitro.history) == 2 and "loss" in nitro.history[-1]
    assert nx.read_manifest(str(tmp_path))[-1].stop_reason == "early_stop"
    assert policy.wait == 0 and math.isnan(
        policy.best
    )  # the instance passed is untouched


def test_early_stopping_counters_resume(tmp_path):
    kw = {"run_dir": str(tmp_path), "logger": None}
    first = nx.Nitro(
        Tiny(max_epochs=1),
        early_stop=nx.EarlyStopping(patience=2, min_delta=10.0),
        **kw,
    )
    first.train()
    assert first.prepared.stopper.wait == 0
    resumed = nx.Nitro(
        Tiny(max_epochs=10),
        early_stop=nx.EarlyStopping(patience=2, min_delta=10.0),
        resume="auto",
        **kw,
    )
    assert resumed.prepared.stopper.best == pytest.approx(first.prepared.stopper.best)
    resumed.train()
    assert resumed.current_epoch == 3  # epochs 2 and 3 fail to improve


@pytest.mark.parametrize("value", ["0.93", b"0.5", np.str_("0.5"), 0.5 + 1j])
def test_a_control_readback_refuses_what_is_not_a_real_number(value):
    message = rf"`acc` is {re.escape(repr(value))}, not a real number \(it is a "
    with pytest.raises(nx.CheckpointError, match=message):
        nx.watch.check_control_readback(value, "checkpoint metric", "acc")
    stopper = nx.EarlyStopping(metric="acc", mode="max", patience=1)
    with pytest.raises(nx.CheckpointError, match=message):
        stopper.should_stop(1, {"acc": value})
    for real in (True, 2, np.float32(0.5), jnp.asarray(0.5, jnp.bfloat16)):
        assert nx.watch.check_control_readback(real, "checkpoint metric", "acc") == real


def test_the_handle_holds_its_own_copy_of_the_stopping_policy():
    policy = nx.EarlyStopping(patience=3)
    nitro = nx.Nitro(Tiny(), early_stop=policy, **quiet())
    held = nitro.early_stop
    assert held is not policy and policy.metric is None  # the instance is untouched
    assert (held.metric, held.mode, held.patience) == ("loss", "min", 3)
    assert nx.Nitro(Tiny(), **quiet()).early_stop is None


def test_a_custom_stopping_policy():
    class AfterTwo:
        def should_stop(self, epoch, metrics):
            return epoch >= 2

    nitro = nx.Nitro(Tiny(max_epochs=5), early_stop=AfterTwo(), **quiet())
    nitro.train()
    assert nitro.stop_reason == "early_stop" and nitro.current_epoch == 2


def test_early_stopping_refusals():
    with pytest.raises(nx.ConfigError, match="early_stop needs a val split"):
        nx.Nitro(OneBatch(), early_stop=nx.EarlyStopping(), **quiet())
    with pytest.raises(nx.ConfigError, match="patience=0\\) must be an int >= 1"):
        nx.EarlyStopping(patience=0)
    with pytest.raises(
        nx.ConfigError, match="EarlyStopping watches `acc`, but Tiny defines no metrics"
    ):
        nx.Nitro(
            Tiny(), early_stop=nx.EarlyStopping(metric="acc", mode="max"), **quiet()
        )


@pytest.mark.parametrize("given", [{"metric": "acc"}, {"mode": "max"}])
@pytest.mark.parametrize("owner", ["EarlyStopping", "Plateau"])
def test_half_a_metric_and_mode_is_refused(owner, given):
    half = "a metric without its mode" if "metric" in given else "a mode without"
    with pytest.raises(nx.ConfigError, match=f"{owner}\\(metric=.*gives {half}"):
        if owner == "EarlyStopping":
            nx.EarlyStopping(**given)
        else:
            nx.Plateau(0.01, **given)
