"""The binding report, the frozen values and repr: rich on a terminal, text in logs."""

import logging

from experiments import Tiny
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
