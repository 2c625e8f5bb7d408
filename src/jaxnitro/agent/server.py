"""`nitro mcp`: the `nitro_*` tools served over the Model Context Protocol (stdio).

The server is the `mcp` SDK's `MCPServer` (the `mcp` extra, imported here only, so
`import jaxnitro` never loads it) with one tool per `AgentTools` method. Each call's
raw arguments are checked against the tool's signature first
(`arguments.check_arguments`: an unknown argument is refused by name, a missing one
named, a wrong JSON type described), then by the tool against the experiment's
fields and the run settings. A tool that refuses its
arguments answers a tool error whose text is the refusal, and a failure no check
foresaw still answers its exception's text; the server
itself never stops for a client's mistake or a run's failure. When the client closes
the connection, every active run is asked to stop (a training validates and
checkpoints the epoch it was in) and joined for up to `shutdown_timeout` seconds.
"""

from __future__ import annotations

import functools
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

from ..errors import NitroError
from ..extras import require
from .arguments import check_arguments
from .tools import CLIENT_KEYWORDS, SETUP_NOTE, AgentTools

RUN_SOURCE = (
    "Give either run (the id of an earlier run whose handle to use, such as a "
    "finished training) or experiment (`path/to/file.py:ClassName` under the "
    "server's root, with optional preset, overrides, run_dir and keywords, for a new "
    "handle)."
)
EXPERIMENT_ARGS = (
    "experiment: `path/to/file.py:ClassName`, the file under the server's root. "
    "preset: a preset name of the class. overrides: field name -> JSON scalar, "
    "checked by the experiment's fields. run_dir: under the root (default "
    "runs/ClassName). keywords: run keywords among " + ", ".join(CLIENT_KEYWORDS) + "."
)
BACKGROUND = (
    "Returns the run id at once (the work runs in the background); poll nitro_status."
)

DESCRIPTIONS = {
    "nitro_setup": "setup_devices: the JAX backend and visible devices of the server "
    "process, and its n_devs pin. " + SETUP_NOTE,
    "nitro_train": "Start training an experiment in the background. "
    + EXPERIMENT_ARGS
    + " "
    + BACKGROUND,
    "nitro_validate": "Start validate() (the val split) on a handle. "
    + RUN_SOURCE
    + " "
    + BACKGROUND,
    "nitro_evaluate": "Start evaluate(split) on a handle. "
    + RUN_SOURCE
    + " "
    + BACKGROUND,
    "nitro_predict": "Start predict on a handle: over a split of its data (split, "
    "default test), or on inputs (field name -> rows, batch axis first). The result "
    "gives each output's shape, dtype and first rows. " + RUN_SOURCE + " " + BACKGROUND,
    "nitro_export": "Start exporting a handle's model as a StableHLO bundle "
    "dir/name (dir under the root, default export; batch_sizes default [1]). "
    + RUN_SOURCE
    + " "
    + BACKGROUND,
    "nitro_status": "A run's state, phase (and the phases it went through), step, "
    "epoch, progress counter, compile cache hits and misses since it started, last "
    "metrics, stop reason, result, and error with traceback text. Without run: "
    "every run.",
    "nitro_stop": "Ask a run to stop at its next step boundary (a training still "
    "validates and checkpoints that epoch); returns at once.",
    "nitro_logger": "Where a run's logger writes (logger_info).",
    "nitro_history": "A run's per-epoch history: the table as text, and its "
    "columns and rows as data.",
    "nitro_runs": "The runs a run directory (under the root) holds, most recent first.",
    "nitro_cache": "The compile cache counters: hits, misses, entries.",
}


def build_server(tools: AgentTools) -> Any:
    """An `MCPServer` with one `nitro_*` tool per `AgentTools` method.

    Raises:
        MissingExtraError: the `mcp` package is not installed.
    """
    require("mcp", extra="mcp", feature="nitro mcp")
    from mcp.server.mcpserver.exceptions import ToolError

    functions: dict[str, Callable[..., Any]] = {}
    server = _server_class(functions)(
        "jaxnitro",
        instructions=(
            "Drive jaxnitro training runs: start one with nitro_train, poll "
            "nitro_status, stop it with nitro_stop, read nitro_history, then "
            "nitro_evaluate / nitro_predict / nitro_export with run=<its id>."
        ),
        log_level="WARNING",
    )

    def register(name: str, fn: Callable[..., Any]) -> None:
        @functools.wraps(fn)
        def tool(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except NitroError as error:
                raise ToolError(f"{name}: {error}") from error
            except Exception as error:
                # A failure no check foresaw still reaches the model with its text
                # (the SDK would answer only "Error executing tool").
                raise ToolError(
                    f"{name} failed: {type(error).__name__}: {error or 'no message'}. "
                    f"Check the arguments against the tool's description."
                ) from error

        functions[name] = fn
        server.add_tool(tool, name=name, description=DESCRIPTIONS[name])

    for fn in _tool_functions(tools):
        register(fn.__name__, fn)
    return server


def _server_class(functions: dict[str, Callable[..., Any]]) -> type:
    """The SDK's `MCPServer`, checking each call's raw arguments against the
    signature of the tool's function in `functions` (name -> function) first."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    class NitroServer(MCPServer):  # type: ignore[misc,valid-type]
        """The SDK server, checking each call's raw arguments first: the SDK's
        pydantic model would drop an unknown argument and word a wrong type in
        its own terms."""

        async def call_tool(
            self, name: str, arguments: dict[str, Any], context: Any = None
        ) -> Any:
            fn = functions.get(name)
            if fn is not None:
                try:
                    check_arguments(name, fn, arguments if arguments else {})
                except NitroError as error:
                    raise ToolError(str(error)) from error
            return await super().call_tool(name, arguments, context)

    return NitroServer


def _tool_functions(tools: AgentTools) -> tuple[Callable[..., Any], ...]:
    """The `nitro_*` tools, one per `AgentTools` method, in the order the server
    lists them: their names and signatures are the tools' names and argument
    schemas."""
    return (*_start_tools(tools), *_watch_tools(tools))


def _start_tools(tools: AgentTools) -> tuple[Callable[..., Any], ...]:
    """`nitro_setup` and the tools that start a background run."""

    def nitro_setup(
        backend: str | None = None, n_devs: int | None = None
    ) -> dict[str, Any]:
        return tools.setup(backend, n_devs)

    def nitro_train(
        experiment: str,
        preset: str | None = None,
        overrides: dict[str, Any] | None = None,
        run_dir: str | None = None,
        keywords: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        return tools.train(experiment, preset, overrides, run_dir, keywords)

    def nitro_validate(
        run: str | None = None,
        experiment: str | None = None,
        preset: str | None = None,
        overrides: dict[str, Any] | None = None,
        run_dir: str | None = None,
        keywords: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        return tools.validate(**_source(locals()))

    def nitro_evaluate(
        split: str = "test",
        run: str | None = None,
        experiment: str | None = None,
        preset: str | None = None,
        overrides: dict[str, Any] | None = None,
        run_dir: str | None = None,
        keywords: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        return tools.evaluate(split, **_source(locals()))

    def nitro_predict(
        split: str = "test",
        inputs: dict[str, Any] | None = None,
        run: str | None = None,
        experiment: str | None = None,
        preset: str | None = None,
        overrides: dict[str, Any] | None = None,
        run_dir: str | None = None,
        keywords: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        return tools.predict(split, inputs, **_source(locals()))

    def nitro_export(
        name: str,
        dir: str = "export",
        batch_sizes: list[int] | None = None,
        run: str | None = None,
        experiment: str | None = None,
        preset: str | None = None,
        overrides: dict[str, Any] | None = None,
        run_dir: str | None = None,
        keywords: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        return tools.export(name, dir, batch_sizes, **_source(locals()))

    return (
        nitro_setup,
        nitro_train,
        nitro_validate,
        nitro_evaluate,
        nitro_predict,
        nitro_export,
    )


def _watch_tools(tools: AgentTools) -> tuple[Callable[..., Any], ...]:
    """The tools that read or stop runs, and the compile cache's counters."""

    def nitro_status(run: str | None = None) -> dict[str, Any]:
        return tools.status(run)

    def nitro_stop(run: str) -> dict[str, Any]:
        return tools.stop(run)

    def nitro_logger(run: str) -> dict[str, Any]:
        return tools.logger(run)

    def nitro_history(run: str) -> dict[str, Any]:
        return tools.history(run)

    def nitro_runs(run_dir: str) -> dict[str, Any]:
        # One object, not a bare list: the SDK sends a list as one content per item.
        return {"run_dir": run_dir, "runs": tools.runs(run_dir)}

    def nitro_cache() -> dict[str, int]:
        return tools.cache()

    return (
        nitro_status,
        nitro_stop,
        nitro_logger,
        nitro_history,
        nitro_runs,
        nitro_cache,
    )


def serve(
    root: str | os.PathLike[str],
    *,
    max_runs: int = 2,
    shutdown_timeout: float = 60.0,
) -> list[str]:
    """Serve the `nitro_*` tools on stdin/stdout until the client disconnects.

    Args:
        root: the folder experiment files are read from and runs write under.
        max_runs: how many background runs may be active at once.
        shutdown_timeout: seconds to wait for the runs to stop at the end.

    Returns:
        The ids of the runs still active when the shutdown wait ended.

    Raises:
        ConfigError: `root` is not a directory, or `max_runs` is not >= 1.
        MissingExtraError: the `mcp` extra is not installed.
    """
    tools = AgentTools(root, max_runs=max_runs)
    server = build_server(tools)
    import anyio

    # A client that closes stdin and then sends SIGTERM (the SDK's own client does,
    # two seconds later) still gets the graceful stop below.
    on_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _interrupt) if on_main else None
    try:
        anyio.run(server.run_stdio_async)
    except KeyboardInterrupt:
        pass
    finally:
        if on_main:
            signal.signal(signal.SIGTERM, previous)
        left = tools.shutdown(shutdown_timeout)
    return left


def _interrupt(signum: int, frame: Any) -> None:
    """SIGTERM: leave the serving loop as Ctrl+C would, into the graceful stop."""
    raise KeyboardInterrupt


_SOURCE_KEYS = ("run", "experiment", "preset", "overrides", "run_dir", "keywords")


def _source(values: dict[str, Any]) -> dict[str, Any]:
    """The run-source arguments of a verb tool, as `AgentTools` takes them."""
    return {k: values[k] for k in _SOURCE_KEYS if values.get(k) is not None}
