"""Time to first step, phase by phase: jaxnitro against a hand-written loop, cold
and with the persistent compilation cache warm.

Every measurement runs in a fresh process. Both clocks start at the same point:
after the imports (JAX, then jaxnitro or Optax), the backend's start-up and the
synthetic data build; both end when the first step's loss is on the host. The
reference is `throughput.py`'s hand-written `jax.jit` + Optax RAdam step; its clock
covers the parameters' initialization, `tx.init`, the jit and the first step, as
jaxnitro's covers `Nitro(...)` (which builds the model) and `train()` up to the
first step's loss.

Three runs of each side per round, interleaved, in this order:

- cold: the persistent compilation cache off (the throughput table's setting);
- first: the cache on, in a new empty directory (a user's first process);
- warm: a second process on the directory `first` filled.

The reference turns JAX's persistent cache on the way jaxnitro does (same
directory setting, same minimum compile time), so "warm" compares like with like.

    python benchmarks/first_step.py                 # both workloads, 3 rounds
    python benchmarks/first_step.py --rounds 1 --workload tutorial_mlp
    python benchmarks/first_step.py --phases        # jaxnitro's phases, one process
    python benchmarks/first_step.py --imports       # python -X importtime, summed
    python benchmarks/first_step.py --before /tmp/old/src   # an A/B of two builds
    python benchmarks/first_step.py --phases --unpacked   # + jaxnitro cold, unpacked

`--unpacked` adds, to `--phases`, one cold process of jaxnitro with its state passed
leaf by leaf (`compile/packed.py`'s packing off), so the compile seconds of its
train step show what the packing costs the compiler.

The phase split comes from timers this script wraps around jaxnitro's setup
functions (no timer lives in the package) and from JAX's own compile events
(`jax.monitoring`: tracing, lowering to MLIR, XLA compilation, cache retrievals).

The parent process never imports JAX (on a TPU machine only one process can open the
chip): the banner's backend is the one the first child reports.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from typing import Any

from _common import (
    WORKLOADS,
    BannerOnce,
    backend_info,
    jax_compile_log,
    run_child_json,
    synthetic_batches,
)

SHOW_BANNER = BannerOnce()

# The setup functions timed as phases: (module, attribute, phase label). Each is a
# name `jaxnitro.run.setup` (or the loop) calls through its module's globals, so
# replacing the global times every call. Unlisted work lands in "other".
SETUP_TIMERS = (
    ("jaxnitro.run.setup", "RunConfig", "resolve config"),
    ("jaxnitro.run.setup", "freeze_hooks", "freeze hooks"),
    ("jaxnitro.run.setup", "hook_fingerprints", "hook fingerprints"),
    ("jaxnitro.run.setup", "check_split", "check splits"),
    ("jaxnitro.run.setup", "probe_routing", "probe routing"),
    ("jaxnitro.run.setup", "data_signature", "data signature"),
    ("jaxnitro.run.setup", "auto_prefetch", "prefetch settings"),
    ("jaxnitro.run.setup", "TrainState", "first train state"),
    ("jaxnitro.run.setup", "build_plan", "optimizer plan"),
    ("jaxnitro.run.setup", "compile_view", "compile view"),
    ("jaxnitro.run.setup", "probe_outputs", "write probes"),
    ("jaxnitro.run.setup", "configure_persistent_cache", "persistent cache"),
    ("jaxnitro.run.training", "starting_state", "optimizer state"),
    ("jaxnitro.loop.calls", "call_program", "step program"),
)
HOOK_PHASES = {"build_data": "build_data", "build_model": "build_model"}
JAX_EVENTS = {
    "/jax/core/compile/jaxpr_trace_duration": "jax trace",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "jax lower",
    "/jax/core/compile/backend_compile_duration": "xla compile",
    "/jax/compilation_cache/cache_retrieval_time_sec": "cache retrieval",
}


class PhaseClock:
    """Seconds per phase label, the outermost timed call counted once."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)
        self._depth = 0

    def wrap(self, fn: Any, label: str) -> Any:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self._depth:
                return fn(*args, **kwargs)
            self._depth += 1
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[label] += time.perf_counter() - start
                self._depth -= 1

        return timed

    def listen(self, event: str, seconds: float, **_: Any) -> None:
        label = JAX_EVENTS.get(event)
        if label is not None:
            self.seconds[label] += seconds
            self.counts[label] += 1

    def count(self, event: str, **_: Any) -> None:
        if event == "/jax/compilation_cache/cache_hits":
            self.counts["cache hits"] += 1


def _install_timers(clock: PhaseClock) -> None:
    import importlib

    import jaxnitro.run.setup as setup

    for module_name, name, label in SETUP_TIMERS:
        module = importlib.import_module(module_name)
        original = getattr(module, name)
        if isinstance(original, type):  # a class: time its classmethods' use
            for method in ("resolve", "initial"):
                if method in vars(original):
                    bound = getattr(original, method)
                    setattr(
                        original, method, classmethod(clock.wrap(bound.__func__, label))
                    )
            continue
        setattr(module, name, clock.wrap(original, label))
    hook_function = setup.hook_function

    def timed_hook(cls: Any, name: str) -> Any:
        found = hook_function(cls, name)
        return clock.wrap(found, HOOK_PHASES.get(name, f"hook {name}"))

    setup.hook_function = timed_hook


def _persistent_cache(directory: str | None) -> None:
    """The reference's persistent cache, set as jaxnitro sets its own."""
    if directory is None:
        return
    import jax

    from jaxnitro.compile.cache import configure_persistent_cache

    os.environ["JAXNITRO_COMPILATION_CACHE"] = directory
    configure_persistent_cache()  # in its folder for this process's CPU count
    assert jax.config.values["jax_compilation_cache_dir"].startswith(directory)


def measure(name: str, side: str, phases: bool) -> dict[str, Any]:
    """One cold start in this process; the phases and the clocked total."""
    marks = {"start": time.perf_counter()}
    import jax

    marks["import jax"] = time.perf_counter()
    if side == "jaxnitro":
        import jaxnitro as nx
    else:
        import optax  # noqa: F401
    marks["import library"] = time.perf_counter()
    jax.numpy.zeros(1).block_until_ready()  # the backend's start-up, common to both
    marks["backend"] = time.perf_counter()
    widths, batch, _ = WORKLOADS[name]
    batches = synthetic_batches(batch, 1)
    marks["data"] = time.perf_counter()

    clock = PhaseClock()
    jax.monitoring.register_event_duration_secs_listener(clock.listen)
    jax.monitoring.register_event_listener(clock.count)
    compiles = jax_compile_log() if phases else []
    directory = os.environ.get("FIRST_STEP_CACHE")
    result: dict[str, Any] = {}
    if side == "jaxnitro":
        from _common import make_experiment

        if phases:
            _install_timers(clock)
        exp = make_experiment(widths, batches)
        import jaxnitro.loop.steps as steps

        if os.environ.get("FIRST_STEP_UNPACKED"):
            import jaxnitro.loop.calls as calls

            calls.pack_rule = lambda: None  # the state passed leaf by leaf

        settle, settle_losses = steps.EpochLog.settle, steps.EpochLog.settle_losses
        first_loss: list[float] = []
        first_cpu: list[float] = []

        def settled() -> None:
            if not first_loss:
                first_loss.append(time.perf_counter())
                first_cpu.append(time.process_time())

        def timed_settle(log: Any, item: Any) -> None:
            settle(log, item)
            settled()

        def timed_settle_losses(log: Any, losses: Any) -> bool:
            # A call of losses only settles them in one pass (loop/calls.py).
            done = settle_losses(log, losses)
            if done:
                settled()
            return done

        steps.EpochLog.settle = timed_settle  # type: ignore[method-assign]
        steps.EpochLog.settle_losses = timed_settle_losses  # type: ignore[method-assign]
        start, cpu = time.perf_counter(), time.process_time()
        nitro = nx.Nitro(exp(max_epochs=1), logger=None, checkpointer=None)
        built = time.perf_counter()
        nitro.train()
        returned = time.perf_counter()
        result["setup"] = built - start
        result["first_step"] = first_loss[0] - start
        result["first_step_cpu"] = first_cpu[0] - cpu
        result["train_returned"] = returned - start
    else:
        from throughput import reference_loop

        _persistent_cache(directory)
        start, cpu = time.perf_counter(), time.process_time()
        _, first = reference_loop(widths, batches)
        first()  # ends with the loss on the host (block_until_ready)
        result["first_step"] = time.perf_counter() - start
        result["first_step_cpu"] = time.process_time() - cpu
    names = list(marks)
    pairs = zip(names[:-1], names[1:], strict=True)
    result["before_clock"] = {label: marks[label] - marks[was] for was, label in pairs}
    result["phases"] = dict(clock.seconds)
    result["counts"] = dict(clock.counts)
    first = start + result["first_step"]
    for kind in ("compiled", "traced"):
        result[kind] = [
            (n, sec) for was, n, sec, at in compiles if was == kind and at <= first
        ]
    result["backend"] = backend_info()
    return result


def _run(
    name: str,
    side: str,
    cache: str | None,
    phases: bool = False,
    src: str | None = None,
    unpacked: bool = False,
) -> dict:
    env = dict(os.environ)
    env.pop("FIRST_STEP_CACHE", None)
    env.pop("FIRST_STEP_UNPACKED", None)
    if unpacked:
        env["FIRST_STEP_UNPACKED"] = "1"
    if src is not None:  # another build of jaxnitro: its `src` folder first
        env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])
    if cache is None:
        env["JAXNITRO_COMPILATION_CACHE"] = "off"
    else:
        env["JAXNITRO_COMPILATION_CACHE"] = cache
        env["FIRST_STEP_CACHE"] = cache
    args = [__file__, "--internal", name, side]
    if phases:
        args.append("--phases")
    out = run_child_json(args, env)
    SHOW_BANNER(out["backend"])
    return out


def rounds(name: str, count: int, before: str | None) -> dict[str, list[float]]:
    """`count` rounds of cold / first / warm for each side, interleaved; with
    `before` (another build's `src` folder) that build's jaxnitro too."""
    sides = [("jaxnitro", "jaxnitro", None), ("reference", "reference", None)]
    if before is not None:
        sides.insert(1, ("before", "jaxnitro", before))
    times: dict[str, list[float]] = defaultdict(list)
    for _ in range(count):
        with tempfile.TemporaryDirectory() as root:
            # Each kind of start for every side back to back, so a slow stretch
            # of a shared machine hits the runs it pairs alike.
            for kind in ("cold", "first", "warm"):
                for label, side, src in sides:
                    cache = None if kind == "cold" else os.path.join(root, label)
                    out = _run(name, side, cache, src=src)
                    times[f"{label} {kind}"].append(out["first_step"])
                    times[f"{label} {kind} cpu"].append(out["first_step_cpu"])
    return times


def _ratio(top: list[float], bottom: list[float]) -> str:
    """The median of the paired ratios, and the ratio of the best (fastest) runs."""
    paired = statistics.median(a / b for a, b in zip(top, bottom, strict=True))
    return f"{paired:.2f}x paired, {min(top) / min(bottom):.2f}x best"


def report(times: dict[str, list[float]]) -> None:
    """Each side's runs, then the ratios: wall-clock, and CPU time (the process's
    own, which other jobs on a shared machine disturb far less)."""
    sides = [key[: -len(" cold")] for key in times if key.endswith(" cold")]
    for side in sides:
        for kind in ("cold", "first", "warm"):
            for clock in ("", " cpu"):
                values = times[f"{side} {kind}{clock}"]
                shown = ", ".join(f"{v:.3f}" for v in values)
                label = f"{side} {kind}{clock or ' wall'}"
                print(
                    f"  {label:22s} median {statistics.median(values):.3f} s, "
                    f"best {min(values):.3f} s  ({shown})"
                )
    for clock in ("", " cpu"):
        print(f"  {'CPU time' if clock else 'wall-clock'}:")
        for side in sides:
            if side != "reference":
                cold = _ratio(
                    times[f"{side} cold{clock}"], times[f"reference cold{clock}"]
                )
                print(f"    cold, {side} / reference: {cold}")
        for side in sides:
            warm = _ratio(times[f"{side} warm{clock}"], times[f"{side} first{clock}"])
            off = _ratio(times[f"{side} warm{clock}"], times[f"{side} cold{clock}"])
            print(f"    {side}: warm / first {warm}; warm / cold {off}")


def show_phases(name: str, unpacked: bool = False) -> None:
    """Each side's phases in three fresh processes: cold, first, warm; with
    `unpacked`, a cold jaxnitro process with its state unpacked too."""
    runs = [
        (side, label, label != "cold", False)
        for side in ("jaxnitro", "reference")
        for label in ("cold", "first", "warm")
    ]
    if unpacked:
        runs.insert(3, ("jaxnitro", "cold, unpacked", False, True))
    with tempfile.TemporaryDirectory() as parent:
        for side, label, cached, leaves in runs:
            where = os.path.join(parent, side) if cached else None
            if where is not None:
                os.makedirs(where, exist_ok=True)
            out = _run(name, side, where, phases=True, unpacked=leaves)
            print(f"{name} {side} {label}: first step {out['first_step']:.3f} s")
            before = ", ".join(f"{k} {v:.3f}" for k, v in out["before_clock"].items())
            print(f"  before the clock: {before}")
            if side == "jaxnitro":
                print(
                    f"  setup {out['setup']:.3f} s, train() returned at "
                    f"{out['train_returned']:.3f} s"
                )
                # A timer that never ran wraps a name jaxnitro no longer calls
                # through that module: its time went to no phase.
                never = [x for *_, x in SETUP_TIMERS if x not in out["phases"]]
                if never:
                    print(f"  never timed (stale SETUP_TIMERS): {', '.join(never)}")
            counts = out["counts"]
            for key, seconds in sorted(out["phases"].items(), key=lambda kv: -kv[1]):
                n = f" x{counts[key]}" if key in counts else ""
                print(f"    {key:20s} {seconds:.3f}{n}")
            if "cache hits" in counts:
                print(f"    cache hits {counts['cache hits']}")
            compiled = sorted(out["compiled"], key=lambda c: -c[1])
            total = sum(sec for _, sec in compiled)
            shown = ", ".join(f"{n} {sec:.3f}" for n, sec in compiled[:8])
            more = len(compiled) - 8
            print(
                f"  compiled before the first step: {len(compiled)} programs, "
                f"{total:.3f} s: {shown or 'nothing'}"
                + (f" and {more} more" if more > 0 else "")
            )
            traced = sorted(out["traced"], key=lambda c: -c[1])
            shown = ", ".join(f"{n} {sec:.3f}" for n, sec in traced[:4])
            print(f"  traced before the first step, the longest: {shown or 'nothing'}")


def show_imports() -> None:
    """`python -X importtime -c "import jaxnitro"`, cumulative time per top package."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import jaxnitro"],
        capture_output=True,
        text=True,
    )
    own: dict[str, float] = defaultdict(float)
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        try:
            self_us = int(line.split(":", 1)[1].split("|")[0])
        except ValueError:
            continue
        top = line.rsplit("|", 1)[1].strip().split(".")[0]
        own[top] += self_us / 1e6
    total = sum(own.values())
    print(f"import jaxnitro: {total:.3f} s of module bodies (self time), by package:")
    for top, seconds in sorted(own.items(), key=lambda kv: -kv[1])[:15]:
        print(f"  {top:20s} {seconds:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workload", choices=[*WORKLOADS, "all"], default="all")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--phases", action="store_true")
    parser.add_argument("--imports", action="store_true")
    parser.add_argument(
        "--unpacked",
        action="store_true",
        help="with --phases: also jaxnitro cold with its state unpacked",
    )
    parser.add_argument(
        "--before", help="another build's src folder, measured beside this one"
    )
    parser.add_argument("--internal", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.internal:
        print(json.dumps(measure(*args.internal, phases=args.phases)))
        return
    if args.imports:
        show_imports()
        return
    names = list(WORKLOADS) if args.workload == "all" else [args.workload]
    for name in names:
        if args.phases:
            show_phases(name, args.unpacked)
            continue
        times = rounds(name, args.rounds, args.before)
        print(f"{name}:")
        report(times)


if __name__ == "__main__":
    main()
