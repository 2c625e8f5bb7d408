"""The run's default logger and checkpointer (`run/defaults.py`): the experiment's
base accessors return `RUN_DEFAULT`, and the run makes the objects."""

import os

from experiments import Tiny

import jaxnitro as nx
from jaxnitro import RunConfig
from jaxnitro.experiment.run_accessors import RUN_DEFAULT


def test_the_base_accessors_ask_for_the_runs_default():
    assert Tiny().logger() is RUN_DEFAULT
    assert Tiny().checkpointer() is RUN_DEFAULT
    assert repr(RUN_DEFAULT) == "RUN_DEFAULT"


def test_the_run_makes_a_jsonlogger_and_a_checkpointer_by_default(tmp_path):
    config = RunConfig.resolve(Tiny(), {"run_dir": str(tmp_path)})
    assert isinstance(config.logger, nx.JSONLogger)
    assert isinstance(config.checkpointer, nx.Checkpointer)
    assert config.checkpointer.keep == (nx.Best(3), nx.Last(1))
    assert config.sources["logger"] == config.sources["checkpointer"] == "default"


def test_an_override_returning_super_gets_the_default_too(tmp_path):
    class Deferring(Tiny):
        def logger(self):
            return super().logger()

        def checkpointer(self):
            return super().checkpointer()

    nitro = nx.Nitro(Deferring(), run_dir=str(tmp_path))
    assert isinstance(nitro.logger, nx.JSONLogger)
    assert isinstance(nitro.checkpointer, nx.Checkpointer)
    assert nitro.config.sources["logger"] == "method"
    nitro.train()
    assert os.path.exists(tmp_path / "metrics.jsonl")
    assert nitro.checkpointer.entries()


def test_each_handle_gets_its_own_default_objects(tmp_path):
    first = RunConfig.resolve(Tiny(), {"run_dir": str(tmp_path)})
    second = RunConfig.resolve(Tiny(), {"run_dir": str(tmp_path)})
    assert first.logger is not second.logger
    assert first.checkpointer is not second.checkpointer
