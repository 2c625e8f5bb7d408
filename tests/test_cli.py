"""The `nitro` / `sexpgpu` command line."""

import subprocess
import sys

import pytest

import jaxnitro as nx
from jaxnitro.cli import main


def test_version(capsys):
    try:
        main(["--version"])
    except SystemExit as stop:
        assert stop.code == 0
    assert capsys.readouterr().out.strip() == f"jaxnitro {nx.__version__}"


def test_help_lists_what_it_is(capsys):
    assert main([]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert (
        out.startswith("usage: nitro") and "compiles only when the graph changes" in out
    )


def test_module_entry_point_runs():
    done = subprocess.run(
        [sys.executable, "-m", "jaxnitro.cli", "--help"], capture_output=True, text=True
    )
    assert done.returncode == 0 and "--version" in done.stdout


def test_the_usage_line_names_the_program_it_was_called_by(monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["/venv/bin/sexpgpu", "--help"])
    with pytest.raises(SystemExit):
        main()
    assert capsys.readouterr().out.startswith("usage: sexpgpu")
