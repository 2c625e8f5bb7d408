"""`nitro train`, `nitro history` and `nitro summary` on a Python experiment file,
run in-process through `cli.main`."""

import csv
import io
import json

import jax
import numpy as np
import pytest
from agent_root import AGENT_FILE

from jaxnitro.cli import main
from jaxnitro.observe.run_log import read_run_logs


@pytest.fixture
def experiment(tmp_path):
    path = tmp_path / "tiny_agent.py"
    path.write_text(AGENT_FILE.read_text())
    return f"{path}:TinyAgent"


def _run(capsys, *argv):
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.fixture
def resumed(experiment, tmp_path, capsys):
    """A run dir trained 1 epoch, then resumed to 3 through `nitro train`."""
    run_dir = str(tmp_path / "rd")
    first = _run(capsys, "train", experiment, "--set", "max_epochs=1",
                 "--run-dir", run_dir)  # fmt: skip
    assert first[0] == 0, first[2]
    second = _run(capsys, "train", experiment, "--set", "max_epochs=3",
                  "--run-dir", run_dir, "--resume", "auto")  # fmt: skip
    assert second[0] == 0, second[2]
    assert "its history starts at epoch 2" in second[1]
    return run_dir


def test_train_then_resume_and_history_shows_every_epoch(resumed, capsys):
    status, out, _ = _run(capsys, "history", resumed)
    assert status == 0
    lines = out.splitlines()
    assert "3 epochs over 2 segments, resumed from epoch 1" in lines[0]
    epochs = [int(line.split()[-5]) for line in lines if line.split()[-5:-4]
              and line.split()[-5].isdigit()]  # fmt: skip
    assert epochs == [1, 2, 3]


def test_history_csv_and_json_parse_back_to_the_logged_numbers(resumed, capsys):
    [log] = read_run_logs(resumed)
    status, out, _ = _run(capsys, "history", resumed, "--csv")
    assert status == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [int(r["epoch"]) for r in rows] == [1, 2, 3]
    assert [int(r["segment"]) for r in rows] == [1, 2, 2]
    assert [int(r["step"]) for r in rows] == [4, 8, 12]
    for row, logged in zip(rows, log.rows, strict=True):
        assert float(row["train_loss"]) == logged["train_loss"]
        assert float(row["loss"]) == logged["loss"]
    status, out, _ = _run(capsys, "history", resumed, "--json")
    assert status == 0
    [run] = json.loads(out)["runs"]
    assert run["segments"] == 2 and run["resumed_from"] == [1]
    assert run["status"] == "completed"
    assert [r["epoch"] for r in run["rows"]] == [1, 2, 3]
    assert [r["loss"] for r in run["rows"]] == [r["loss"] for r in log.rows]
    assert all(np.isfinite(r["train_loss"]) for r in run["rows"])


def test_history_run_selects_one_run_and_refuses_an_unknown_id(resumed, capsys):
    [log] = read_run_logs(resumed)
    status, out, _ = _run(capsys, "history", resumed, "--run", log.run_id, "--csv")
    assert status == 0 and len(out.splitlines()) == 4
    status, _, err = _run(capsys, "history", resumed, "--run", "nope")
    assert status == 1 and f"holds no run 'nope'; its runs: {log.run_id}" in err


def _write_log(path, lines):
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_a_resume_drops_the_abandoned_epochs_and_a_later_row_wins(tmp_path):
    def epoch(e, loss):
        return {"type": "epoch", "run_id": "r", "row": {"epoch": e, "step": e,
                "loss": loss}}  # fmt: skip

    _write_log(
        tmp_path / "metrics.jsonl",
        [
            {"type": "params", "run_id": "r"},
            epoch(1, 1.0),
            epoch(2, 2.0),
            epoch(3, 3.0),  # abandoned: the resume continues from epoch 1
            {"type": "resume", "run_id": "r", "step": 1, "epoch": 1},
            {"type": "params", "run_id": "r"},
            epoch(2, 0.5),  # a stop cut epoch 2 short ...
            epoch(2, 0.2),  # ... and the next train() finished it
        ],
    )
    [log] = read_run_logs(tmp_path)
    assert [(r["epoch"], r["loss"], r["segment"]) for r in log.rows] == [
        (1, 1.0, 1),
        (2, 0.2, 2),
    ]


def test_history_skips_a_line_over_the_bounds(tmp_path, capsys):
    _write_log(
        tmp_path / "metrics.jsonl",
        [{"type": "epoch", "run_id": "r", "row": {"epoch": 1, "step": 1}}],
    )
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write("[" * 100 + "\n")
    status, out, err = _run(capsys, "history", str(tmp_path), "--csv")
    assert status == 0 and "line 2 nests 100 levels deep" in err
    assert out.splitlines()[1].startswith("r,1,1,1")


def test_history_names_a_missing_run_dir_or_log(tmp_path, capsys):
    status, _, err = _run(capsys, "history", str(tmp_path / "gone"))
    assert status == 1 and f"{tmp_path / 'gone'} is not a directory" in err
    status, _, err = _run(capsys, "history", str(tmp_path))
    assert status == 1 and f"{tmp_path} holds no metrics.jsonl" in err


def test_history_plot_needs_one_run(tmp_path, capsys):
    _write_log(
        tmp_path / "metrics.jsonl",
        [
            {"type": "epoch", "run_id": a, "row": {"epoch": 1, "step": 1, "x": 1.0}}
            for a in ("a", "b")
        ],
    )
    status, _, err = _run(capsys, "history", str(tmp_path), "--plot", "p.png")
    assert status == 2 and "holds runs a, b. Pass --run ID" in err


def test_summary_counts_every_parameter(experiment, capsys):
    status, out, err = _run(capsys, "summary", experiment, "--set", "width=16")
    assert status == 0, err
    # TinyAgent's params: w1 (8, width) and w2 (width, 3).
    total = 8 * 16 + 16 * 3
    assert out.splitlines()[0] == (
        f"TinyAgent: {total} parameters ({total * 4} B) in 1 group"
    )
    assert f"default       2         {total}" in out
    assert "step cost: " in out and "nothing compiled or run" in out
    assert "programs: none compiled yet" in out


def test_summary_of_a_trained_handle_lists_its_programs(tmp_path):
    import sys

    sys.path.insert(0, str(AGENT_FILE.parent))
    try:
        from tiny_agent import TinyAgent
    finally:
        sys.path.remove(str(AGENT_FILE.parent))
    import jaxnitro as nx

    nitro = nx.Nitro(TinyAgent(max_epochs=1), run_dir=str(tmp_path))
    untrained = nitro.summary()
    assert untrained.programs == () and untrained.step_flops > 0
    nitro.train()
    s = nitro.summary()
    sizes = sum(int(np.size(x)) for x in jax.tree.leaves(nitro.parameters))
    assert s.parameters == sizes and s.bytes == 4 * sizes
    kinds = [p.kind for p in s.programs]
    assert kinds[0] == "train_step" and "eval_forward" in kinds
    assert all(p.compile_seconds >= 0 for p in s.programs)
    assert s.step_flops == s.programs[0].flops
    assert "train_step" in str(s) and "compiled train program" in s.step_source


def test_where_a_lowering_has_no_analysis_the_summary_lowers_on_the_cpu(
    tmp_path, monkeypatch
):
    """A TPU's plugin backend analyses compiled programs only (`Lowered.cost_analysis`
    gives None there): the summary lowers the same gradient on the host's CPU
    device, still compiling nothing."""
    import sys

    sys.path.insert(0, str(AGENT_FILE.parent))
    try:
        from tiny_agent import TinyAgent
    finally:
        sys.path.remove(str(AGENT_FILE.parent))
    import jax.stages

    import jaxnitro as nx

    nitro = nx.Nitro(TinyAgent(max_epochs=1), run_dir=str(tmp_path))
    expected = nitro.summary().step_flops
    real = jax.stages.Lowered.cost_analysis
    asked = []

    def plugin_backend(self):  # the first lowering, on the default backend
        asked.append(self)
        return None if len(asked) == 1 else real(self)

    monkeypatch.setattr(jax.stages.Lowered, "cost_analysis", plugin_backend)
    monkeypatch.setattr(
        jax.stages.Lowered, "compile", lambda self: pytest.fail("compiled")
    )
    s = nitro.summary()
    assert len(asked) == 2 and s.step_flops == expected > 0
    assert "nothing compiled or run" in s.step_source


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (
            "widht=3",
            "`widht` is not a field of TinyAgent. Nearest names: `widht` -> `width`",
        ),  # fmt: skip
        (
            "width=1.5",
            "--set width='1.5': TinyAgent.width is a GraphConst field "
            "declared int, so it takes a whole number",
        ),  # fmt: skip
        (
            "lr=fast",
            "--set lr='fast': TinyAgent.lr is a Host field declared "
            "float, so it takes a number",
        ),  # fmt: skip
        ("width=0", "width"),  # the field's declared range (ge=1)
        ("width", "--set takes FIELD=VALUE, got 'width'"),
    ],
)
def test_train_refuses_a_bad_set_naming_the_field(experiment, capsys, setting,
                                                  message):  # fmt: skip
    status, _, err = _run(capsys, "train", experiment, "--set", setting)
    assert status == 2 and message in err


def test_train_names_a_missing_file(tmp_path, capsys):
    status, _, err = _run(capsys, "train", f"{tmp_path}/none.py:X")
    assert status == 2 and "no experiment file" in err
