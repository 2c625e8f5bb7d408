"""A fork server for tests/checkpoint/test_crash_safety.py: training processes to
SIGKILL.

Started once per test, it imports JAX and jaxnitro (the slow part) without touching a
device, then forks one training process per request read from stdin, as one JSON
line each:

    {"run_dir": ..., "status": ..., "kill": "after:replace:3" | null,
     "delay": 0.4 | null, "finalize": "error" | null}

The child trains `Tiny(max_epochs=6)` with `resume="auto"` and writes its status file
(the epoch and run it resumed at, then how it ended). `kill` is a fault-injection
point, `<when>:<operation>:<n>`: the child SIGKILLs itself before (`before`) or after
(`after`) the n-th call, made by jaxnitro's checkpoint code, of `os.replace`,
`os.fsync`, `os.remove`, `tempfile.mkstemp` or safetensors' `save_file`; `torn`
(save_file only) truncates the temporary record to half before the kill, as a crash
in the middle of the write would. With `finalize`, train()'s own closing call to
`checkpointer.finalize` passes that stop reason instead (a rewrite of the last
record's stop_reason, which "completed" would not need), and only the calls made
from there on count, so the kill lands inside the rewrite.
`delay` kills the child from the server after that many seconds instead. The server
answers each request with one JSON line: {"signal": n} or {"exit": code}.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time


def _kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _install(spec: str, armed: list[bool]) -> None:
    import tempfile

    from jaxnitro.checkpoint import record

    when, operation, nth = spec.split(":")
    targets = {
        "replace": (os, "replace"),
        "fsync": (os, "fsync"),
        "remove": (os, "remove"),
        "mkstemp": (tempfile, "mkstemp"),
        "save_file": (record, "save_file"),
    }
    owner, name = targets[operation]
    real = getattr(owner, name)
    calls = [0]

    def wrapper(*args, **kwargs):
        caller = sys._getframe(1).f_globals.get("__name__", "")
        hit = False
        if armed[0] and caller.startswith("jaxnitro.checkpoint"):
            calls[0] += 1
            hit = calls[0] == int(nth)
        if hit and when == "before":
            _kill_self()
        result = real(*args, **kwargs)
        if hit and when == "torn":
            path = args[1]
            with open(path, "r+b") as f:
                f.truncate(os.path.getsize(path) // 2)
        if hit:
            _kill_self()
        return result

    setattr(owner, name, wrapper)


def _child(request: dict) -> None:
    from experiments import Tiny

    import jaxnitro as nx

    status = request["status"]
    armed = [request.get("finalize") is None]
    if request.get("kill"):
        _install(request["kill"], armed)
    nitro = nx.Nitro(
        Tiny(max_epochs=6), run_dir=request["run_dir"], resume="auto", logger=None
    )
    # Written whole or not at all: a timed SIGKILL may land mid-write.
    with open(status + ".partial", "w") as f:
        json.dump({"start": nitro.current_epoch, "run": nitro.checkpoint_run}, f)
    os.replace(status + ".partial", status)
    if request.get("finalize"):
        checkpointer = nitro.checkpointer
        finalize = checkpointer.finalize

        def armed_finalize(reason: str) -> bool:
            armed[0] = True  # from here on, the injection point counts calls
            return finalize(request["finalize"])

        checkpointer.finalize = armed_finalize
    nitro.train()
    with open(status + ".done", "w") as f:
        json.dump({"epoch": nitro.current_epoch, "stop": nitro.stop_reason}, f)


def serve(cache_dir: str) -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import jax

    jax.config.update("jax_compilation_cache_dir", cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    import experiments  # noqa: F401

    import jaxnitro  # noqa: F401

    print("ready", flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                _child(request)
            except BaseException as error:  # reported through the exit code
                print(f"crash_worker child: {error!r}", file=sys.stderr, flush=True)
                code = 3
            os._exit(code)
        status = None
        if request.get("delay") is not None:
            deadline = time.monotonic() + request["delay"]
            while status is None:
                done, code = os.waitpid(pid, os.WNOHANG)
                if done:
                    status = code
                elif time.monotonic() >= deadline:
                    os.kill(pid, signal.SIGKILL)
                    break
                else:
                    time.sleep(0.005)
        if status is None:
            _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            answer = {"signal": os.WTERMSIG(status)}
        else:
            answer = {"exit": os.WEXITSTATUS(status)}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    serve(sys.argv[1])
