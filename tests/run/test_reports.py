"""The binding report, the frozen values and repr: rich on a terminal, text in logs."""

import logging

import grain
from experiments import Tiny, samples
from rich.console import Console

import jaxnitro as nx


def test_setup_logs_the_binding_report_when_not_on_a_terminal(caplog):
    with caplog.at_level(logging.INFO, logger="jaxnitro"):
        nitro = nx.Nitro(Tiny(), logger=None, checkpointer=None)
    records = [r.getMessage() for r in caplog.records if r.name == "jaxnitro"]
    assert len(records) == 1
    assert records[0].startswith("jaxnitro: Tiny\njaxnitro binding report for Tiny")
    assert records[0].endswith(nitro.binding_report())


def test_repr_and_the_rich_table_show_the_same_frozen_values():
    nitro = nx.Nitro(Tiny(max_epochs=3), accum=2, logger=None, checkpointer=None)
    console = Console(width=100, record=True, color_system=None)
    console.print(nitro)
    rendered = console.export_text()
    for name, value in nitro.frozen().items():
        assert f"{name} {value}" in repr(nitro)
        assert name in rendered and str(value) in rendered
    assert "phase Starting" in repr(nitro) and "phase Starting" in rendered


def test_the_binding_report_says_what_drop_last_discards():
    class Dropping(Tiny):
        def build_data(self, dist):
            train = grain.MapDataset.source(samples(70)).batch(16, drop_remainder=True)
            return {"train": train}

    report = nx.Nitro(Dropping(), logger=None, checkpointer=None).binding_report()
    assert "train drop-last discards 6 samples an epoch" in report
    listed = nx.Nitro(Tiny(), logger=None, checkpointer=None).binding_report()
    assert "train drop-last discards 0 samples an epoch" in listed
