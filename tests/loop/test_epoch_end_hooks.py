"""`Nitro.on_epoch_end`: a host hook between epochs, its metrics in the run's record."""

import json

import pytest
from experiments import Tiny

import jaxnitro as nx


def test_an_epoch_end_hook_sees_each_epoch_and_its_metrics_join_the_run(tmp_path):
    seen = []

    def test_too(nitro, epoch, observations):
        seen.append((epoch, nitro.current_step, sorted(observations)))
        nitro.set_device(smoothing=0.1 * epoch)  # before the next epoch's steps
        return {"test": nitro.evaluate("test"), "hooked": float(epoch)}

    nitro = nx.Nitro(Tiny(max_epochs=2), run_dir=str(tmp_path))
    nitro.on_epoch_end(test_too).train()
    assert seen == [(1, 4, ["loss", "train_loss"]), (2, 8, ["loss", "train_loss"])]
    assert nitro.device_value("smoothing") == pytest.approx(0.2)
    rows = list(nitro.history)
    assert [row["hooked"] for row in rows] == [1.0, 2.0]
    assert rows[-1]["test/loss"] == pytest.approx(nitro.evaluate("test")["loss"])
    lines = [
        json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()
    ]
    validate = [x for x in lines if x.get("context") == "validate"]
    assert [x["hooked"] for x in validate] == [1.0, 2.0]
    assert "test/loss" in validate[0] and "loss" in validate[0]


def test_a_hook_that_raises_ends_the_run_with_its_error_and_a_bad_one_is_refused():
    def broken(nitro, epoch, observations):
        raise RuntimeError("curriculum broke at epoch " + str(epoch))

    quiet = {"logger": None, "checkpointer": None}
    nitro = nx.Nitro(Tiny(max_epochs=3), **quiet).on_epoch_end(broken)
    with pytest.raises(RuntimeError, match="broke at epoch 1"):
        nitro.train()
    assert nitro.stop_reason == "error" and nitro.current_step == 4
    with pytest.raises(nx.ConfigError, match="on_epoch_end takes a function"):
        nx.Nitro(Tiny(), **quiet).on_epoch_end(3)
    wrong = nx.Nitro(Tiny(), **quiet).on_epoch_end(lambda n, e, o: [1.0])
    with pytest.raises(nx.ConfigError, match="returned list; it returns a dict"):
        wrong.train()
