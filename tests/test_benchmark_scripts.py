"""Every script in benchmarks/ runs as a user runs it, in its smallest mode.

The benchmarks promise to run unchanged on a CPU (and on the TPU machine), and
several reach into the package's internals (a function they wrap, a call's
arguments), which break them silently when the package moves. So each script runs
here in a process of its own, from the repository root, on the CPU, with the flags
of its quickest run, and must exit 0 and print the lines its results are read from,
leaving nothing behind. A new script needs an entry in RUNS.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest
from process_jobs import child_path

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
TIMEOUT = 120  # seconds a script may take; each takes under 15 on 2 cores

F = r"-?\d+\.\d+"  # a printed figure
BANNER = r"jax \S+ on .+ \(cpu, \d+ devices?\), \d+ cores"
"""How every script's first line starts (benchmarks/README.md)."""


class Run(NamedTuple):
    """A script, the flags of its smallest run and what its output must show."""

    script: str
    flags: tuple[str, ...]
    shows: tuple[str, ...]
    """Patterns, each matching a whole line of stdout."""
    never: tuple[str, ...] = ()
    """Patterns no line of stdout may match."""
    check: Callable[[str], None] | None = None
    """More checks on stdout, after the script has exited."""
    marks: tuple[pytest.MarkDecorator, ...] = ()
    banner: bool = True
    """Whether stdout starts with the banner (a run that starts no backend has none)."""


def server_stopped(stdout: str) -> None:
    """serve_load.py's server listened on loopback and is gone with the script."""
    found = re.search(r" on http://127\.0\.0\.1:(\d+); ", stdout)
    assert found, "the server's start line does not name 127.0.0.1"
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", int(found.group(1))), timeout=5).close()


def same_programs(stdout: str, sides: tuple[str, ...]) -> None:
    """one_epoch.py: the jaxnitro `sides` compiled as many programs (a call cut
    short at the epoch's end runs the same train program)."""
    counts = {
        side: re.search(rf"  jaxnitro {side} .* (\d+) programs compiled", stdout)
        for side in sides
    }
    assert all(counts.values()), stdout
    assert len({m.group(1) for m in counts.values() if m}) == 1, stdout


def every_compile_timed(stdout: str) -> None:
    """compile_parts.py: each variant's program was compiled, not read back from a
    cache (which logs no compile: 0 s)."""
    seconds = re.findall(rf"^  \S.*? ({F}) s  \(", stdout, flags=re.MULTILINE)
    assert len(seconds) == 5 and all(float(s) > 0 for s in seconds), stdout


if importlib.util.find_spec("grain") is not None:
    GRAIN_ROW = rf"    the tutorial Grain loader, fan-out 2\s+{F}x\s+{F} ms/step .*"
else:
    GRAIN_ROW = r"    the tutorial Grain loader, fan-out 2\s+left out: .*"

RUNS = (
    Run(
        "data_parallel.py",
        ("--epochs", "2"),  # the epoch time is over epochs 2 on
        (
            rf"1 device\s+{F}\s+1\.00\s+0\.00e\+00\s+{F}",
            rf"4 devices, replicated\s+{F}\s+{F}\s+\S+e[+-]\d+\s+{F}",
            rf"4 devices, fsdp\s+{F}\s+{F}\s+\S+e[+-]\d+\s+{F}",
        ),
    ),
    Run(
        "device_trace.py",
        ("--epochs", "1", "--workload", "tiny_mlp", "--top", "3", "--source", "fanout"),
        (
            r"tiny_mlp, hand-written loop:",
            r"tiny_mlp, jaxnitro k=8:",
            rf"    wall {F} us a step \(64 steps traced\)",
            r"    host thread .* \(own time, nested events apart\):",
            rf"\s+{F} us/step\s+{F}/step  .+",
        ),
    ),
    Run(
        "compile_parts.py",
        ("--reps", "1"),
        (
            r"tutorial_mlp: the step program's XLA compile seconds, median of 1 .*",
            *(
                rf"  {variant}\s+{F} s  \({F}\)"
                for variant in (
                    "packed",
                    "unpacked",
                    "packed, no loss ring write",
                    "unpacked, no loss ring write",
                    "hand-written",
                )
            ),
        ),
        check=every_compile_timed,
    ),
    Run(
        "dispatch_costs.py",
        ("--steps", "16", "--reps", "1"),
        (
            rf"numpy batch\s+{F} us/step\s+1\.000x",
            rf"block 8 staged by a thread\s+{F} us/step\s+{F}x",
            rf"while 8 \(dynamic n\)\s+{F} us/step\s+{F}x",
            rf"is_ready\(\)\s+{F} us",
        ),
    ),
    Run(
        "first_step.py",
        ("--rounds", "1", "--workload", "tutorial_mlp"),
        (
            r"tutorial_mlp:",
            rf"  jaxnitro warm wall\s+median {F} s, best {F} s  \({F}\)",
            rf"    cold, jaxnitro / reference: {F}x paired, {F}x best",
            rf"    jaxnitro: warm / first {F}x paired, {F}x best; warm / cold .*",
        ),
    ),
    Run(
        "first_step.py",
        ("--phases", "--unpacked", "--workload", "tutorial_mlp"),
        (
            rf"tutorial_mlp jaxnitro cold: first step {F} s",
            rf"tutorial_mlp jaxnitro cold, unpacked: first step {F} s",
            rf"    step program\s+{F}",  # a timer inside the training loop
            rf"    xla compile\s+{F} x\d+",
            rf"  compiled before the first step: \d+ programs, {F} s: "
            rf".*jit\(train_step\) {F}.*",  # JAX's own compile log, read back
            rf"tutorial_mlp reference warm: first step {F} s",
        ),
        never=(r"  never timed .*",),
    ),
    Run(
        "first_step.py",
        ("--imports",),
        (rf"import jaxnitro: {F} s of module bodies .*", rf"  jaxnitro\s+{F}"),
        banner=False,  # it times `import jaxnitro` alone
    ),
    Run(
        "gpt2.py",
        (
            "--config",
            "tiny",
            "--steps",
            "8",
            "--cadence",
            "4",
            "--yardstick",
            "--loss-chunks",
            "4",
            "--profile",
        ),
        (  # two blocks
            r"workload: tiny, .*, attention auto: xla on cpu, loss chunks 4 "
            r"\(the reference's: 0\)",
            rf"python api / reference tokens/s: {F} stepping .*",
            rf"run file / reference tokens/s: {F} stepping .*",
            r"run file vs reference: loss at \d+ logged steps within .*",
            r"python api data_wait_frac: median \d+\.\d+%, largest .*",
            r"reference vs itself with its cross-entropy through log_softmax, 8 "
            r"bf16 steps \(.*\): loss at 2 logged steps within .*",
            r"profile, 8 steps a side \(programs compiled before\): device time by "
            r"part, named scopes of the model and the step",
            rf"  python api: {F} ms a step traced, setup in",
            r"    no device plane in this backend's trace: no time by part",
        ),
    ),
    Run(
        "attention.py",
        ("--quick", "--reps", "2"),
        (
            r"causal attention, batch 2 x 256, 4 heads of 64, bf16: the median of 2 "
            r"calls",
            rf"  xla \(written out\)\s+forward\s+{F} ms   forward \+ backward\s+{F} "
            r"ms   largest difference from xla 0",
            r"  the Pallas kernels' rows left out: they compile for a TPU only, and "
            r"this backend is 'cpu'",
        ),
    ),
    Run(
        "host_field_compile.py",
        ("--reps", "1"),
        (
            r"Host field: \d+ MB",
            rf"setup \+ first step \(compiles included\): with the Host field {F} s, "
            rf"without {F} s, ratio {F}",
        ),
    ),
    Run(
        "logger_cost.py",
        ("--quick",),
        (rf"tutorial MLP on cpu, .* default logger / logger=None = {F}x paired .*",),
    ),
    Run(
        "loop_profile.py",
        ("--reps", "1", "--top", "5"),
        (
            rf"jaxnitro steps_per_call=1: {F} us a step",
            r"jaxnitro's train call alone, 1 steps a call \(\d+ buffers in, \d+ out\)"
            rf": {F} us a call, {F} us a step",
            rf"jaxnitro steps_per_call=1, the loop's Python alone \(the program "
            rf"handing its state back\): {F} us a step inside the loop, {F} around it",
            rf"hand-written, numpy batch: the main thread's CPU {F} us a step, {F} of "
            r"it in its jit calls",
            rf"jaxnitro steps_per_call=8: the main thread's CPU {F} us a step inside "
            rf"the hot loop, {F} of it in its program calls",
            rf"jaxnitro steps_per_call=8, an epoch of 60 steps: epoch {F}, lead-in "
            rf"{F}, calls {F}, drain {F}, after {F}, around {F} us",
            rf"jaxnitro steps_per_call=1: the device's span {F} us a step "
            rf"\(hand-written {F}\), the host alone at the epoch's edges {F} us an "
            r"epoch",
            rf"cProfile, steps_per_call=1: {F} us a step",
        ),
    ),
    Run(
        "one_epoch.py",
        ("--quick",),
        (
            rf"  hand-written loop\s+{F} s\s+{F} steps/s\s+1\.000x of the hand-written "
            r"loop\s+\d+ programs compiled .*",
            rf"  jaxnitro, no keyword\s+{F} s\s+{F} steps/s\s+{F}x .*",
            rf"tutorial_mlp one epoch: k=8 over k=1 {F}x, no keyword over k=1 {F}x .*",
        ),
        check=lambda stdout: same_programs(stdout, ("k=1", "k=8")),
    ),
    Run(
        "optimizer_features.py",
        ("--reps", "1"),
        (rf"two groups \+ decay .*: jaxnitro/hand-written = {F}x paired .*",),
    ),
    Run(
        "precision.py",
        ("--epochs", "2"),  # the step time is the last epoch's: not the compile's
        (
            rf"f32\s+{F}\s+{F}\s+{F}",
            rf"bf16\s+{F}\s+{F}\s+{F}",
            r"bf16 accuracy gap: [+-]\d+\.\d\d points .*",
            rf"bf16 step time: {F}x f32 .*",
        ),
    ),
    Run(
        "prefetch.py",
        ("--quick",),
        (
            rf"    fan-out, workers=2\s+data_wait_frac\s+{F}%\s+\d+ steps/s",
            rf"    one producer\s+{F}x\s+{F} ms/step",
            rf"    fan-out, 2 workers, staged\s+{F}x\s+{F} ms/step",
            rf"    one producer, staged, copy waited\s+{F}x\s+{F} ms/step",
            GRAIN_ROW,
            rf"    16 batches \( ?{F} MB\):\s+{F} us alone \( ?{F} GB/s\), .*",
            rf"    the stack of 16 batches on this thread:\s+{F} us",
        ),
    ),
    Run(
        "runfile.py",
        ("--blocks", "2", "--repeats", "1"),  # --realistic alone takes 40 s
        (
            rf"median ratio run file / python api: {F} \(target >= 0\.95\); median "
            rf"data_wait_frac {F}",
            rf"fastest block: run file {F} steps/s, python api {F} steps/s, .*",
        ),
    ),
    Run(
        "serve_load.py",
        ("--clients", "2", "--requests", "5"),
        (
            rf"2 clients x 5 requests: 10/10 answered correctly, p50 {F} ms, .*",
            r"  server: .* shutting down after \d+ requests .*",
        ),
        check=server_stopped,
        marks=(pytest.mark.needs_sockets,),
    ),
    Run(
        "split_step.py",
        ("--reps", "1"),
        tuple(
            rf"{name}: s/epoch fused {F}, split {F}; the split costs {F}%\. .*"
            for name in ("tutorial_mlp", "compute_bound_mlp")
        ),
    ),
    Run(
        "steps_per_call.py",
        (
            *("--reps", "1", "--workload", "tiny_mlp"),
            *("--unpacked", "--packed-each-step", "--one-batch-blocks"),
        ),
        (
            rf"tiny_mlp: speed over the reference, paired: jaxnitro k=1 {F}x, k=8 "
            rf"{F}x, hand-written scan k=8 {F}x; .*",
            rf"tiny_mlp: unpacked: k=1 {F}x, k=8 {F}x .*",
            rf"tiny_mlp: packed each step: k=1 {F}x, k=8 {F}x .*",
            rf"tiny_mlp: one-batch blocks: k=1 {F}x, k=8 {F}x .*",
        ),
    ),
    Run(
        "throughput.py",
        ("--quick", "--workload", "tutorial_mlp"),
        (
            rf"tutorial_mlp: throughput jaxnitro/reference = {F}x paired, .*",
            rf"tutorial_mlp: first step jaxnitro/reference = {F}x \({F} s vs {F} s\); "
            r"peak RSS \d+ MB vs \d+ MB",
        ),
    ),
)


def run_id(run: Run) -> str:
    return " ".join((run.script, *run.flags))


def script_env(temp: Path) -> dict[str, str]:
    """A user's environment on a CPU: no test-only XLA flags (this process's four
    fake devices), no job, no persistent compile cache, temporary files in `temp`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k != "XLA_FLAGS" and not k.startswith(("NITRO_", "JAX_COORD"))
    }
    env.update(
        PYTHONPATH=child_path(),
        JAX_PLATFORMS="cpu",
        JAXNITRO_COMPILATION_CACHE="off",
        TMPDIR=str(temp),
    )
    return env


def run_script(run: Run, temp: Path) -> subprocess.CompletedProcess[str]:
    """`python benchmarks/<script> <flags>` from the repository root. Past TIMEOUT
    its whole process group is killed (a server or child it started too)."""
    args = [sys.executable, f"benchmarks/{run.script}", *run.flags]
    with subprocess.Popen(
        args,
        cwd=ROOT,
        env=script_env(temp),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as process:
        try:
            out, err = process.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            out, err = process.communicate()
            pytest.fail(f"{run_id(run)} ran past {TIMEOUT} s:\n{out}\n{err[-4000:]}")
    return subprocess.CompletedProcess(args, process.returncode, out, err)


def test_every_script_has_a_run():
    scripts = {p.name for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_")}
    assert {run.script for run in RUNS} == scripts


@pytest.mark.slow  # a process per script, about two minutes in all on 2 cores
@pytest.mark.parametrize(
    "run",
    [pytest.param(run, id=run_id(run), marks=run.marks) for run in RUNS],
)
def test_the_script_runs_in_its_smallest_mode(run, tmp_path):
    temp = tmp_path / "tmp"
    temp.mkdir()
    before = set(ROOT.iterdir())
    done = run_script(run, temp)
    assert done.returncode == 0, done.stderr[-4000:]
    lines = done.stdout.splitlines()
    if run.banner:
        assert lines and re.match(BANNER, lines[0]), done.stdout[:2000]
    for pattern in run.shows:
        assert any(re.fullmatch(pattern, line) for line in lines), (
            f"no line matches {pattern!r}:\n{done.stdout}"
        )
    for pattern in run.never:
        found = [line for line in lines if re.fullmatch(pattern, line)]
        assert not found, found
    if run.check is not None:
        run.check(done.stdout)
    # Nothing left behind: its temporary folders removed, nothing new in the checkout.
    assert list(temp.iterdir()) == []
    assert set(ROOT.iterdir()) == before
