"""Where a step of jaxnitro's hot loop goes, on this backend.

On the tutorial MLP (784-128-10, batch 100, RAdam; `--workload` picks another of
`steps_per_call.py`'s), one process:

- the floors: the hand-written `jax.jit` step over NumPy batches and over batches
  already on the device (microseconds a step);
- what a dispatch costs per argument on this backend: a jitted function of n device
  scalars returning n scalars, for a few n (a launch's fixed cost and its cost per
  buffer);
- jaxnitro at steps_per_call 1 and K (the history's epoch seconds, per step);
- jaxnitro's own train call replayed alone (the executable the loop calls, with the
  arguments of its last call, outputs fed back in): the loop's floor, all Python
  of the loop taken away;
- the loop's own Python alone: jaxnitro's epochs with the train program replaced,
  after each epoch's first call, by one that hands its state arguments back at
  once (microseconds a step inside the hot loop, and around it in the epoch);
- the main thread's CPU time a step, the hand-written loop's and jaxnitro's hot
  loop's (its wait for the device included), and how much of it is spent inside
  the jit or program calls: on a CPU backend the device's threads share the cores,
  so the host's CPU is taken from the steps;
- where an epoch's wall time goes at steps_per_call 1 and K: from the hot loop's
  entry to its first dispatch, the calls, from the last call until its losses are
  on the host (the device draining its queue), from there to the loop's exit, and
  around the loop; then the device's span (first dispatch to the last losses read)
  a step beside the hand-written step, and the host's time alone at the epoch's
  edges (the epoch's seconds outside that span, when the device has nothing
  queued);
- a cProfile of jaxnitro epochs at steps_per_call 1 (`--profile-steps-per-call`):
  the functions with the most own time, in microseconds a step.

    python benchmarks/loop_profile.py
    python benchmarks/loop_profile.py --steps-per-call 8 --top 30
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import pstats
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from _common import (
    WORKLOADS,
    apply,
    banner,
    cross_entropy,
    init_params,
    make_experiment,
)
from steps_per_call import workload

EPOCHS = 3


def floors(
    widths, batches: list[dict], reps: int
) -> tuple[dict[str, float], tuple[float, float]]:
    """Microseconds a step of the hand-written loop, NumPy and device batches; and
    over NumPy batches, the main thread's CPU microseconds a step and those inside
    its jit calls (`host_cpu`'s floor)."""
    import jax
    import optax

    tx = optax.radam(1e-3)

    def step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(lambda p: cross_entropy(apply(p, x), y))(
            params
        )
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    jitted = jax.jit(step, donate_argnums=(0, 1))
    placed = [jax.device_put(b) for b in batches]
    out: dict[str, float] = {}
    cpu: list[tuple[float, float]] = []  # over NumPy batches: (a step, its calls)
    for name, feed in (("numpy batch", batches), ("device batch", placed)):
        params = init_params(widths)
        opt = tx.init(params)
        params, opt, loss = jitted(params, opt, feed[0]["x"], feed[0]["y"])
        loss.block_until_ready()
        times = []
        for _ in range(reps):
            start, cpu_start, in_calls = time.perf_counter(), time.thread_time(), 0.0
            for b in feed:
                called = time.thread_time()
                params, opt, loss = jitted(params, opt, b["x"], b["y"])
                in_calls += time.thread_time() - called
            loss.block_until_ready()
            times.append((time.perf_counter() - start) / len(feed))
            if name == "numpy batch":
                used = time.thread_time() - cpu_start
                cpu.append((used / len(feed) * 1e6, in_calls / len(feed) * 1e6))
        out[name] = statistics.median(times) * 1e6
    step_cpu = statistics.median(c[0] for c in cpu)
    return out, (step_cpu, statistics.median(c[1] for c in cpu))


def per_buffer(counts: tuple[int, ...], calls: int = 400) -> dict[int, float]:
    """Microseconds a call of a jitted function of n device scalars returning n."""
    import jax
    import jax.numpy as jnp

    out = {}
    for n in counts:
        fn = jax.jit(lambda *xs: tuple(x + 1 for x in xs))
        args = tuple(jnp.float32(i) for i in range(n))
        args = fn(*args)
        jax.block_until_ready(args)
        start = time.perf_counter()
        for _ in range(calls):
            args = fn(*args)
        jax.block_until_ready(args)
        out[n] = (time.perf_counter() - start) / calls * 1e6
    return out


@contextlib.contextmanager
def patched(module: Any, name: str, make: Callable[[Any], Any]) -> Iterator[None]:
    """`module.name` replaced by `make(the real one)` inside the block."""
    real = getattr(module, name)
    setattr(module, name, make(real))
    try:
        yield
    finally:
        setattr(module, name, real)


def programs_through(wrap: Callable[[Any], Any]) -> Any:
    """The calls loop's train programs passed through `wrap(program)` inside the
    block (`patched` on `call_program`)."""
    import jaxnitro.loop.calls as calls_module

    def make(real):
        return lambda *args, **kwargs: wrap(real(*args, **kwargs))

    return patched(calls_module, "call_program", make)


def loops_through(before: Callable[[], Any], after: Callable[[Any], None]) -> Any:
    """Each epoch's hot loop (`call_steps`) bracketed inside the block: `before()`
    at its entry, `after(what before returned)` at its exit."""
    import jaxnitro.loop.steps as steps_module

    def make(real):
        def loop(*args, **kwargs):
            token = before()
            try:
                return real(*args, **kwargs)
            finally:
                after(token)

        return loop

    return patched(steps_module, "call_steps", make)


def handle(exp, per_call: int, scratch: str, epochs: int = 1 + EPOCHS):
    """A jaxnitro handle on `exp` at `per_call`, no checkpointer, its run directory
    (its log) in the folder `scratch`."""
    import jaxnitro as nx

    return nx.Nitro(
        exp(max_epochs=epochs),
        run_dir=tempfile.mkdtemp(dir=scratch),
        checkpointer=None,
        steps_per_call=per_call,
    )


def nitro_steps(exp, per_call: int, *, scratch: str) -> float:
    """Microseconds a step of jaxnitro at `per_call` (median epoch, first dropped);
    its run directory (its log) in the folder `scratch`."""

    nitro = handle(exp, per_call, scratch)
    nitro.train()
    return statistics.median(row["seconds"] for row in nitro.history[2:])


def replay(
    exp, per_call: int, *, scratch: str, calls: int = 400
) -> tuple[float, int, int, int]:
    """`(us a call, steps a call, argument buffers, output buffers)` of jaxnitro's
    train call replayed with its last call's arguments, outputs fed back in."""
    import jax

    captured: dict[str, object] = {}

    def capturing(program):
        def wrapper(*call_args):
            # Copies of the state the call donates, for the replay.
            kept = list(call_args)
            for i in (2, 3, 4):
                kept[i] = jax.tree.map(lambda a: a.copy(), call_args[i])
            captured["program"], captured["args"] = program, kept
            return program(*call_args)

        return wrapper

    with programs_through(capturing):
        handle(exp, per_call, scratch, epochs=1).train()
    program, args = captured["program"], list(captured["args"])  # type: ignore[arg-type]
    n_in = len(jax.tree.leaves(args))
    steps = 1 if per_call == 1 else int(args[9])
    out = program(*args)  # type: ignore[operator]
    n_out = len(jax.tree.leaves(out))
    jax.block_until_ready(out)
    start = time.perf_counter()
    for _ in range(calls):
        args[2], args[3], args[4], args[10] = out[0], out[1], out[2], out[4]
        out = program(*args)  # type: ignore[operator]
    jax.block_until_ready(out)
    return (time.perf_counter() - start) / calls * 1e6, steps, n_in, n_out


def python_alone(
    exp, per_call: int, count: int, *, scratch: str
) -> tuple[float, float]:
    """`(inside, around)`: microseconds a step of jaxnitro's epochs of `count`
    steps (medians after a first) inside the hot loop and around it, the train
    program replaced from each epoch's second call on by one that hands back its
    state and ring arguments and the first call's reports: what the loop's Python
    costs without the device. (It trains nothing past each epoch's first call:
    for timing only.)"""
    spans: list[float] = []

    def handing_back(program):
        first: list = []

        def handed_back(*call_args):
            if not first:  # the epoch's first call runs: its outputs' shapes
                first.append(program(*call_args))
                return first[0]
            return (*call_args[2:5], first[0][3], call_args[10])

        return handed_back

    def ended(start: float) -> None:
        spans.append(time.perf_counter() - start)

    with loops_through(time.perf_counter, ended), programs_through(handing_back):
        nitro = handle(exp, per_call, scratch, epochs=1 + 4 * EPOCHS)
        nitro.train()
    # Epochs 2 on (the history slices by epoch number): the first compiles.
    inside = statistics.median(spans[1:]) / count * 1e6
    epoch = statistics.median(r["seconds"] for r in nitro.history[2:]) / count * 1e6
    return inside, epoch - inside


def host_cpu(exp, per_call: int, count: int, *, scratch: str) -> tuple[float, float]:
    """`(a step, its calls)`: the main thread's CPU microseconds a step inside
    jaxnitro's hot loop at `per_call` (medians over epochs after a first), and
    those inside its train program's calls. On a machine whose cores the device's
    threads share (a CPU backend) every microsecond of it is taken from the
    steps; beside the hand-written loop's (`floors`), what the loop's host work
    costs, waiting for the device included."""
    spans: list[float] = []
    in_calls = [0.0]
    epochs: list[float] = []

    def measured(program):
        def call(*call_args):
            called = time.thread_time()
            try:
                return program(*call_args)
            finally:
                in_calls[0] += time.thread_time() - called

        return call

    def entered() -> float:
        in_calls[0] = 0.0
        return time.thread_time()

    def exited(start: float) -> None:
        spans.append(time.thread_time() - start)
        epochs.append(in_calls[0])

    with loops_through(entered, exited), programs_through(measured):
        handle(exp, per_call, scratch, epochs=1 + 4 * EPOCHS).train()
    return (
        statistics.median(spans[1:]) / count * 1e6,
        statistics.median(epochs[1:]) / count * 1e6,
    )


def timeline(exp, per_call: int, *, scratch: str) -> dict[str, float]:
    """Where an epoch's wall time goes, in microseconds (medians over `EPOCHS`
    epochs after a first): `lead-in` from the hot loop's entry to its first
    dispatch, `calls` from there to the last dispatch's return, `drain` from there
    until the epoch's last losses are on the host (the device runs what is queued;
    the host unpacks the state, reads the next epoch's first block ahead),
    `after` from there to the loop's exit, `around` the rest of the history's
    epoch seconds (the feed opened and closed, the epoch's summary); and `span`,
    the first dispatch to the last losses read (the device at work), and `edges`,
    the epoch's seconds outside it (the host alone, the device idle)."""
    import jaxnitro.loop.settling as settling_module

    marks: list[dict[str, float]] = []

    def entered() -> dict[str, float]:
        mark = {"enter": time.perf_counter()}
        marks.append(mark)
        return mark

    def exited(mark: dict[str, float]) -> None:
        mark["exit"] = time.perf_counter()

    def timed(program):
        def timed_call(*call_args):
            mark = marks[-1]
            mark.setdefault("first", time.perf_counter())
            try:
                return program(*call_args)
            finally:
                mark["last"] = time.perf_counter()

        return timed_call

    def reading(real):
        def read(ring):
            losses = real(ring)  # waits for the call that wrote the ring
            marks[-1]["read"] = time.perf_counter()
            return losses

        return read

    with (
        loops_through(entered, exited),
        programs_through(timed),
        patched(settling_module, "ring_losses", reading),
    ):
        nitro = handle(exp, per_call, scratch)
        nitro.train()
    # The history slices by epoch number: epochs 2 on.
    rows = list(zip(nitro.history[2:], marks[1:], strict=True))

    def median(values) -> float:
        return statistics.median(values) * 1e6

    return {
        "epoch": median(r["seconds"] for r, _ in rows),
        "lead-in": median(m["first"] - m["enter"] for _, m in rows),
        "calls": median(m["last"] - m["first"] for _, m in rows),
        "drain": median(m["read"] - m["last"] for _, m in rows),
        "after": median(m["exit"] - m["read"] for _, m in rows),
        "around": median(r["seconds"] - (m["exit"] - m["enter"]) for r, m in rows),
        "span": median(m["read"] - m["first"] for _, m in rows),
        "edges": median(r["seconds"] - (m["read"] - m["first"]) for r, m in rows),
    }


def profile(exp, per_call: int, top: int, count: int, *, scratch: str) -> None:
    """A cProfile of `EPOCHS` epochs after a first one: own time in us a step."""

    profiler = cProfile.Profile()
    enabled = []

    def after(nitro, epoch, observations):
        # From the end of the first epoch (its compile) on; once: from Python 3.12
        # enabling a running profiler raises.
        if not enabled:
            profiler.enable()
            enabled.append(epoch)

    nitro = handle(exp, per_call, scratch)
    nitro.on_epoch_end(after)
    nitro.train()
    profiler.disable()
    steps = EPOCHS * count
    stats = pstats.Stats(profiler)
    table = stats.stats  # type: ignore[attr-defined]
    rows = sorted(table.items(), key=lambda kv: -kv[1][2])[:top]
    total = sum(v[2] for v in table.values())
    print(f"cProfile, steps_per_call={per_call}: {total / steps * 1e6:.1f} us a step")
    print(f"{'own us/step':>12} {'cum us/step':>12} {'calls/step':>10}  function")
    for (file, line, name), (_, calls, own, cum, _) in rows:
        where = "/".join(file.rsplit("/", 2)[-2:]) + f":{line}" if line else ""
        print(
            f"{own / steps * 1e6:12.1f} {cum / steps * 1e6:12.1f} "
            f"{calls / steps:10.2f}  {name} {where}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps-per-call", type=int, default=8)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument(
        "--workload", choices=[*sorted(WORKLOADS), "tiny_mlp"], default="tutorial_mlp"
    )
    parser.add_argument(
        "--profile-steps-per-call",
        type=int,
        default=1,
        metavar="K",
        help="the steps_per_call of the cProfiled epochs",
    )
    args = parser.parse_args()
    print(banner())

    widths, batches = workload(args.workload)  # steps_per_call.py's
    count = len(batches)
    exp = make_experiment(widths, batches)

    floor, floor_cpu = floors(widths, batches, args.reps)
    for name, us in floor.items():
        print(f"hand-written, {name}: {us:.1f} us a step")
    print(
        f"hand-written, numpy batch: the main thread's CPU {floor_cpu[0]:.1f} us a "
        f"step, {floor_cpu[1]:.1f} of it in its jit calls"
    )
    for n, us in per_buffer((1, 4, 16, 64)).items():
        print(f"jit of {n} device scalars -> {n}: {us:.1f} us a call")
    # jaxnitro's run directories (its default logger's files), removed at the end.
    with tempfile.TemporaryDirectory(prefix="nitro-prof-") as scratch:
        for k in sorted({1, args.steps_per_call}):
            seconds = nitro_steps(exp, k, scratch=scratch)
            print(f"jaxnitro steps_per_call={k}: {seconds / count * 1e6:.1f} us a step")
            us, steps, n_in, n_out = replay(exp, k, scratch=scratch)
            print(
                f"jaxnitro's train call alone, {steps} steps a call ({n_in} buffers "
                f"in, {n_out} out): {us:.1f} us a call, {us / steps:.1f} us a step"
            )
        for k in sorted({1, args.steps_per_call}):
            inside, around = python_alone(exp, k, count, scratch=scratch)
            print(
                f"jaxnitro steps_per_call={k}, the loop's Python alone (the program "
                f"handing its state back): {inside:.1f} us a step inside the loop, "
                f"{around:.1f} around it"
            )
            used, in_calls = host_cpu(exp, k, count, scratch=scratch)
            print(
                f"jaxnitro steps_per_call={k}: the main thread's CPU {used:.1f} us a "
                f"step inside the hot loop, {in_calls:.1f} of it in its program calls"
            )
        for k in sorted({1, args.steps_per_call}):
            parts = timeline(exp, k, scratch=scratch)
            span, edges = parts.pop("span"), parts.pop("edges")
            print(
                f"jaxnitro steps_per_call={k}, an epoch of {count} steps: "
                + ", ".join(f"{name} {us:.1f}" for name, us in parts.items())
                + " us"
            )
            print(
                f"jaxnitro steps_per_call={k}: the device's span {span / count:.1f} "
                f"us a step (hand-written {floor['numpy batch']:.1f}), the host "
                f"alone at the epoch's edges {edges:.1f} us an epoch"
            )
        profile(exp, args.profile_steps_per_call, args.top, count, scratch=scratch)


if __name__ == "__main__":
    main()
