"""The `nitro` / `sexpgpu` command line: --version, --help, and `nitro runs` /
`nitro ckpt` reading a run directory."""

import importlib.metadata
import os
import re
import subprocess
import sys

import pytest
from checkpoint_fixtures import bound, write
from foreign_lock import foreign_lock

import jaxnitro as nx
from jaxnitro.checkpoint.manifest import MANIFEST, read_manifest
from jaxnitro.checkpoint.selectors import Last
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


@pytest.mark.slow  # a Python process of its own
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


@pytest.fixture
def run_dir(tmp_path):
    first = bound(tmp_path, run="aaaa1111", keep=Last(3))
    for epoch in (1, 2, 3):
        write(first, epoch, 1.0 / epoch)
    second = bound(tmp_path, run="bbbb2222", keep=Last(3))
    write(second, 1, 0.25)
    return tmp_path


def test_nitro_runs_prints_the_runs_table(run_dir, capsys):
    assert main(["runs", str(run_dir)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["run", "ckpts", "epochs", "best"]
    assert lines[1].split()[:5] == ["bbbb2222", "1", "1", "0.25", "loss/min"]
    assert lines[1].split()[-1] == "-"  # no parent
    assert lines[2].split()[:5] == ["aaaa1111", "3", "1-3", "0.333333", "loss/min"]


def test_nitro_runs_marks_missing_and_damaged_files(run_dir, capsys):
    entries = {(e.run, e.epoch): e for e in read_manifest(str(run_dir))}
    gone, cut = entries[("aaaa1111", 1)], entries[("aaaa1111", 3)]
    os.remove(run_dir / gone.file)
    path = run_dir / cut.file
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 4)
    (run_dir / ".lock").write_text("1234")  # another file in the directory: ignored
    assert main(["runs", str(run_dir)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[:2] == ["bbbb2222", "1"]
    assert lines[2].split()[:6] == ["aaaa1111", "3", "(1", "missing,", "1", "damaged)"]
    assert lines[3:] == [
        f"run aaaa1111: {gone.file} (epoch 1) is missing.",
        f"run aaaa1111: {cut.file} (epoch 3) is damaged: {path} is truncated or "
        f"damaged: its header describes {os.path.getsize(path) + 4} bytes but the "
        f"file holds {os.path.getsize(path)}. The write that produced it did not "
        f"finish; use another checkpoint.",
    ]
    (summary,) = [s for s in nx.runs(run_dir) if s.id == "aaaa1111"]
    assert (summary.missing, summary.damaged) == ((gone.file,), (cut.file,))


def test_nitro_runs_draws_a_rich_table_on_a_terminal(run_dir, capsys, monkeypatch):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert main(["runs", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "Runs in" in out and "aaaa1111" in out and "1-3" in out


def test_nitro_runs_of_an_empty_or_missing_directory(tmp_path, capsys):
    assert main(["runs", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith("No checkpoints in")
    assert main(["runs", str(tmp_path / "missing")]) == 1
    assert "nitro runs: No run directory at" in capsys.readouterr().err
    (tmp_path / MANIFEST).write_text("{oops")
    assert main(["runs", str(tmp_path)]) == 1
    assert "manifest.json is not valid JSON" in capsys.readouterr().err


def test_nitro_ckpt_prints_checkpoint_info(run_dir, capsys):
    entry = read_manifest(str(run_dir))[-1]
    assert main(["ckpt", str(run_dir / entry.file)]) == 0
    out = capsys.readouterr().out
    assert "  epoch: 1\n" in out and "  step: 4\n" in out and "  run: bbbb2222" in out
    assert "  metrics:\n    loss: 0.25\n" in out
    bad = run_dir / "bad.safetensors"
    bad.write_bytes(b"xx")
    assert main(["ckpt", str(bad)]) == 1
    assert "nitro ckpt: " in capsys.readouterr().err


def test_nitro_runs_lists_each_run_directory_of_a_folder(tmp_path, capsys):
    for name, run in (("mnist", "aaaa1111"), ("cifar", "bbbb2222")):
        write(bound(tmp_path / name, run=run, keep=Last(3)), 1, 0.5)
    (tmp_path / "notes").mkdir()  # a folder that is not a run directory
    assert main(["runs", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{tmp_path / 'cifar'}:"
    assert lines[1].split()[:2] == ["run", "ckpts"]
    assert lines[2].split()[:2] == ["bbbb2222", "1"]
    assert lines[3] == ""
    assert lines[4] == f"{tmp_path / 'mnist'}:"
    assert lines[6].split()[:2] == ["aaaa1111", "1"]
    assert len(lines) == 7


@pytest.mark.parametrize(
    ("run", "which", "expected"),
    [
        ("aaaa1111", "latest", ("aaaa1111", 3)),
        ("aaaa1111", "best", ("aaaa1111", 3)),
        ("latest", "latest", ("bbbb2222", 1)),
        ("all", "best", ("bbbb2222", 1)),
    ],
)
def test_nitro_ckpt_reads_the_record_a_run_which_pair_names(
    run_dir, capsys, run, which, expected
):
    assert main(["ckpt", str(run_dir), run, which]) == 0
    out = capsys.readouterr().out
    assert f"  run: {expected[0]}\n" in out and f"  epoch: {expected[1]}\n" in out


def test_nitro_ckpt_of_a_directory_suggests_a_pair_it_accepts(run_dir, capsys):
    assert main(["ckpt", str(run_dir)]) == 1
    err = capsys.readouterr().err
    suggested = re.search(r"`nitro ckpt (.+?) latest best`", err)
    assert suggested is not None and suggested.group(1) == str(run_dir)
    assert main(["ckpt", suggested.group(1), "latest", "best"]) == 0
    assert "  run: bbbb2222\n" in capsys.readouterr().out
    assert main(["ckpt", str(run_dir), "aaaa1111", "worst"]) == 1
    assert capsys.readouterr().err == (
        "nitro ckpt: ('aaaa1111', 'worst'): which is 'latest' or 'best', not "
        "'worst'; e.g. ('aaaa1111', \"best\").\n"
    )
    assert main(["ckpt", str(run_dir), "cccc3333", "best"]) == 1
    assert "holds no run 'cccc3333'. Its runs: " in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv", [["bogus"], ["runs"], ["ckpt", "a", "b"], ["ckpt", "a", "b", "c", "d"]]
)
def test_usage_errors_exit_with_status_2(argv, capsys):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    assert "usage: nitro" in capsys.readouterr().err


def test_nitro_ckpt_repair_of_a_directory_another_process_writes_is_refused(
    run_dir, capsys
):
    before = (run_dir / MANIFEST).read_bytes()
    fd = foreign_lock(str(run_dir))
    try:
        assert main(["ckpt", "--repair", str(run_dir)]) == 1
    finally:
        os.close(fd)
    err = capsys.readouterr().err
    assert err.startswith("nitro ckpt: The run directory")
    assert "pid 4242 on host gpu-node-7" in err
    assert "this manifest repair is refused" in err
    assert (run_dir / MANIFEST).read_bytes() == before
    assert main(["ckpt", "--repair", str(run_dir)]) == 0  # free again


def test_sexpgpu_is_the_same_program():
    scripts = {
        e.name: e.value
        for e in importlib.metadata.entry_points(group="console_scripts")
        if e.name in ("nitro", "sexpgpu")
    }
    assert scripts == {"nitro": "jaxnitro.cli:main", "sexpgpu": "jaxnitro.cli:main"}
