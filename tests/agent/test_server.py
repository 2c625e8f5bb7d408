import json
import os
import sys
import time
from pathlib import Path

import anyio
import jax
import pytest
from agent_root import make_root
from process_jobs import child_path

import jaxnitro as nx
from jaxnitro.agent.server import DESCRIPTIONS, build_server
from jaxnitro.agent.tools import AgentTools

pytest.importorskip("mcp")  # the `mcp` extra; the test extra installs it
from mcp import Client, StdioServerParameters  # noqa: E402

SRC = Path(nx.__file__).parent.parent
TOOL_NAMES = {
    "nitro_setup",
    "nitro_train",
    "nitro_validate",
    "nitro_evaluate",
    "nitro_predict",
    "nitro_export",
    "nitro_status",
    "nitro_stop",
    "nitro_logger",
    "nitro_history",
    "nitro_runs",
    "nitro_cache",
}


async def call(client, tool, **arguments):
    """A tool's JSON result; a tool error fails with its text."""
    result = await client.call_tool(tool, arguments)
    text = result.content[0].text
    assert not result.is_error, text
    return json.loads(text)


async def error_of(client, tool, **arguments):
    result = await client.call_tool(tool, arguments)
    assert result.is_error
    return result.content[0].text


async def train_stop_history_export(client, root):
    """The agent's round trip: train, watch it compile then step, stop, read the
    history, export. Returns the training's final status. The compile cache must
    be cold (a hit announces no compile phase)."""
    started = await call(client, "nitro_train", experiment="tiny_agent.py:Slow")
    run = started["run"]
    deadline = time.monotonic() + 120
    while True:
        status = await call(client, "nitro_status", run=run)
        assert status["state"] in ("starting", "running"), status
        if status["phase"] == "TrainStepping" and status["step"] > 0:
            break
        assert time.monotonic() < deadline, status
        await anyio.sleep(0.02)
    assert any(p.endswith("Compiling") for p in status["phases"])
    compiled = status["phases"].index("GradientCompiling")
    assert "TrainStepping" in status["phases"][compiled:]
    assert (await call(client, "nitro_stop", run=run))["stopping"] is True
    while status["state"] != "done":
        assert time.monotonic() < deadline, status
        await anyio.sleep(0.05)
        status = await call(client, "nitro_status", run=run)
    assert status["stop_reason"] == "requested"
    history = await call(client, "nitro_history", run=run)
    assert [row["epoch"] for row in history["rows"]] == list(
        range(1, status["epoch"] + 1)
    )
    assert "train_loss" in history["text"]
    export = (await call(client, "nitro_export", name="v1", run=run))["run"]
    while (exported := await call(client, "nitro_status", run=export))["state"] != (
        "done"
    ):
        assert exported["state"] != "failed", exported["traceback"]
        assert time.monotonic() < deadline
        await anyio.sleep(0.05)
    assert exported["result"]["path"] == str(root / "export" / "v1")
    assert (root / "export" / "v1").is_dir()
    return status


@pytest.mark.needs_sockets("pair")  # an asyncio event loop: a socketpair
def test_the_in_process_client_drives_a_run_end_to_end(tmp_path):
    root = make_root(tmp_path)
    tools = AgentTools(root)
    nx.compile.cache_reset()

    async def main():
        async with Client(build_server(tools)) as client:
            listed = await client.list_tools()
            assert {t.name for t in listed.tools} == TOOL_NAMES
            await train_stop_history_export(client, root)
            logger = await call(client, "nitro_logger", run="r1")
            assert logger["path"].endswith("runs/Slow/metrics.jsonl")
            listing = await call(client, "nitro_runs", run_dir="runs/Slow")
            [summary] = listing["runs"]
            assert summary["checkpoints"] >= 1
            assert set(await call(client, "nitro_cache")) == {
                "hits",
                "misses",
                "entries",
            }
            setup = await call(client, "nitro_setup")
            assert setup["backend"] == jax.default_backend()

    try:
        anyio.run(main)
    finally:
        assert tools.shutdown(60) == []


@pytest.mark.needs_sockets("pair")
def test_refusals_are_tool_errors_and_the_server_goes_on(tmp_path):
    root = make_root(tmp_path)
    outside = tmp_path / "outside.py"
    outside.write_text("import os\nos.remove(__file__)\n")
    (root / "link.py").symlink_to(outside)
    tools = AgentTools(root, max_runs=1)

    async def main():
        async with Client(build_server(tools)) as client:
            text = await error_of(client, "nitro_train", experiment="../outside.py:X")
            assert "nitro_train: path '../outside.py' resolves to" in text
            assert "outside the server's root" in text
            text = await error_of(client, "nitro_train", experiment="link.py:X")
            assert "outside the server's root" in text
            text = await error_of(client, "nitro_train", experiment="tiny_agent.py:No")
            assert "has no class 'No'" in text
            text = await error_of(
                client,
                "nitro_train",
                experiment="tiny_agent.py:TinyAgent",
                overrides={"width": "__import__('os')"},
            )
            assert "TinyAgent.width is declared int, so it takes a whole number" in text
            broken = "tiny_agent.py:Broken"
            failed = await call(client, "nitro_train", experiment=broken)
            while (status := await call(client, "nitro_status", run=failed["run"]))[
                "state"
            ] != "failed":
                await anyio.sleep(0.05)
            assert "loss exploded on purpose" in status["traceback"]
            slow = await call(client, "nitro_train", experiment="tiny_agent.py:Slow")
            text = await error_of(
                client, "nitro_train", experiment="tiny_agent.py:TinyAgent"
            )
            assert "at most 1 at once" in text
            await call(client, "nitro_stop", run=slow["run"])

    try:
        anyio.run(main)
    finally:
        assert tools.shutdown(60) == []
    assert outside.exists()  # the file outside the root was never imported


def test_every_tool_has_a_description():
    assert set(DESCRIPTIONS) == TOOL_NAMES
    assert "n_devs pins the device count" in DESCRIPTIONS["nitro_setup"]


@pytest.mark.needs_sockets("pair")
@pytest.mark.slow  # a server process of its own, spoken to over stdio
def test_a_stdio_server_process_drives_a_run_and_stops_its_runs_on_exit(tmp_path):
    root = make_root(tmp_path)
    env = {
        **os.environ,
        "PYTHONPATH": child_path(),
        "JAX_PLATFORMS": "cpu",
        "JAXNITRO_COMPILATION_CACHE": "off",
    }
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "jaxnitro.cli", "mcp", "--root", str(root), "--max-runs", "2"],
        env=env,
    )

    async def main():
        async with Client(params) as client:
            await train_stop_history_export(client, root)
            # Left running when the client goes: the server stops it gracefully.
            started = await call(
                client, "nitro_train", experiment="tiny_agent.py:Slow", run_dir="left"
            )
            while (await call(client, "nitro_status", run=started["run"]))["step"] in (
                None,
                0,
            ):
                await anyio.sleep(0.05)

    anyio.run(main)
    # The run left running was stopped, not killed: its last record says so.
    last = nx.read_manifest(str(root / "left"))[-1]
    assert last.stop_reason == "requested"
    assert 1 <= last.epoch < 50


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--root", "missing"], "root 'missing' is not a directory"),
        (["--max-runs", "0"], "(nitro mcp --max-runs) must be an int >= 1, got 0"),
    ],
)
def test_nitro_mcp_refuses_a_bad_root_or_limit_before_serving(argv, message, capsys):
    from jaxnitro.cli import main

    assert main(["mcp", *argv]) == 1
    assert message in capsys.readouterr().err


def test_the_readme_client_configuration_starts_nitro_mcp():
    import re

    from jaxnitro.cli import build_parser

    readme = (SRC.parent / "README.md").read_text()
    blocks = re.findall(r"```json\n(.*?)```", readme, flags=re.S)
    [block] = [b for b in blocks if "mcpServers" in b]
    server = json.loads(block)["mcpServers"]["jaxnitro"]
    assert server["command"].endswith("/nitro")
    args = build_parser().parse_args(server["args"])
    assert (args.command, args.root, args.max_runs) == (
        "mcp",
        "/path/to/experiments",
        2,
    )


def test_nitro_mcp_without_the_sdk_names_the_extra(tmp_path, monkeypatch, capsys):
    from jaxnitro.cli import main

    monkeypatch.setitem(sys.modules, "mcp", None)  # as if not installed
    assert main(["mcp", "--root", str(tmp_path)]) == 1
    assert "pip install 'jaxnitro[mcp]'" in capsys.readouterr().err


@pytest.mark.needs_sockets("pair")
def test_raw_arguments_are_checked_by_name_and_type_before_any_run(tmp_path):
    root = make_root(tmp_path)
    (root / "notes.txt").write_text("not a run dir")
    tools = AgentTools(root)
    experiment = "tiny_agent.py:TinyAgent"

    async def main():
        async with Client(build_server(tools)) as client:
            text = await error_of(
                client, "nitro_train", experiment=experiment, max_epoch=3
            )
            assert text.startswith("nitro_train has no argument `max_epoch`.")
            assert "Did you mean `keywords`?" not in text
            assert "It takes: experiment, preset (optional)" in text
            text = await error_of(
                client, "nitro_train", experiment=experiment, max_epochs=3
            )
            assert "or pass it inside keywords={'max_epochs': ...}" in text
            text = await error_of(client, "nitro_export", run="r1")
            assert text.startswith(
                "nitro_export needs the argument `name`: the bundle's folder name, "
                "such as 'my_model_v1'. Call it with name=..."
            )
            assert "validation error" not in text  # no raw pydantic text
            text = await error_of(client, "nitro_status", run=3)
            assert text == (
                "nitro_status: argument run=3 is an integer; it takes a string or "
                "null. Pass a string or null."
            )
            text = await error_of(
                client, "nitro_export", name="v1", batch_sizes=["a"], run="r1"
            )
            assert "batch_sizes=['a'] is an array; it takes an array of integers" in (
                text
            )
            text = await error_of(
                client,
                "nitro_train",
                experiment=experiment,
                keywords={"max_epochs": "abc"},
            )
            assert "max_epochs must be an int, got 'abc'" in text
            text = await error_of(
                client, "nitro_train", experiment=experiment, overrides={"width": 0}
            )
            assert "TinyAgent.width must be >= 1, got 0" in text
            text = await error_of(client, "nitro_runs", run_dir="notes.txt")
            assert "runs: run_dir='notes.txt' is a file" in text
            text = await error_of(
                client,
                "nitro_predict",
                inputs={"x": [[1.0], [1.0, 2.0]]},
                experiment=experiment,
            )
            assert "predict inputs['x'] is ragged" in text
            assert (await call(client, "nitro_status"))["runs"] == []

    try:
        anyio.run(main)
    finally:
        assert tools.shutdown(60) == []


def test_an_unforeseen_failure_reaches_the_client_with_its_text(tmp_path):
    tools = AgentTools(make_root(tmp_path))

    def broken(run_dir):
        raise OSError("disk on fire")

    tools.runs = broken  # type: ignore[method-assign]
    server = build_server(tools)

    async def main():
        with pytest.raises(Exception, match="nitro_runs failed: OSError: disk on fire"):
            await server.call_tool("nitro_runs", {"run_dir": "x"})

    anyio.run(main)
