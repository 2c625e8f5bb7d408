"""Where an epoch's time goes, read from a `jax.profiler` trace: jaxnitro at
steps_per_call 1 and K, and the hand-written loop, on one workload, one process.

Each side runs its warm-up epoch (its compiles) untraced, then `--epochs` epochs under
`jax.profiler.start_trace`; the trace (an XSpace) is read back with
`jax.profiler.ProfileData` and summed per side:

- the traced stretch's wall time, in microseconds a step;
- each device plane (`/device:TPU:0` on a TPU; a CPU backend has none): the time
  its `XLA Modules` line was busy (programs running, overlaps merged), as a share of
  the wall (the rest it waited for the host: dispatches, transfers, the loop's
  Python), and the programs and ops that took the most of it;
- the host's threads: the events that took the most time, in microseconds a step,
  each without the events nested in it (the Python tracer's functions, PjRt's own
  events: transfers, executions, buffer frees).

The workloads are `steps_per_call.py`'s (the two of `throughput.py` and the tiny
MLP); jaxnitro runs with its default logger and no checkpointer, as there. Its trace
starts when that logger writes the first epoch's epoch line (an on_epoch_end hook
would turn the read-ahead off and add a write an epoch). `--source` feeds jaxnitro's
sides the list of built batches (the default), or a `PrefetchIterator` over them:
one producer thread (`producer`) or the fan-out's 2 workers (`fanout`), to see where
the threaded paths' time goes (issue 26, item 7); the hand-written sides always read
the list.

    python benchmarks/device_trace.py --workload compute_bound_mlp
    python benchmarks/device_trace.py --steps-per-call 8 --top 20 --keep /tmp/trace
    python benchmarks/device_trace.py --source producer --workload tutorial_mlp
"""

from __future__ import annotations

import argparse
import glob
import os
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterable

from _common import WORKLOADS, banner, make_experiment
from _device_parts import merged_ns
from steps_per_call import reference_scan, workload
from throughput import reference_loop

HOST_LINES_SHOWN = 4  # the host threads with the most traced time


def _threaded(workers: int) -> Callable[[list], object]:
    def wrap(batches: list) -> object:
        import jaxnitro as nx

        return nx.data.PrefetchIterator(Listed(batches), workers=workers)

    return wrap


class Listed:
    """Built batches as a fan-out source (`batch_at`, `begin_epoch`)."""

    def __init__(self, batches: list) -> None:
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def begin_epoch(self) -> None:
        """Nothing to plan: the batches are built."""

    def batch_at(self, i: int) -> dict:
        return self.batches[i]

    def __iter__(self):
        return iter(self.batches)


SOURCES: dict[str, Callable[[list], object]] = {
    "list": lambda batches: batches,
    "producer": _threaded(1),
    "fanout": _threaded(2),
}
"""What feeds jaxnitro's sides (`--source`)."""


class Trace:
    """One side's trace: `start()` and `stop()` around the traced stretch."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.started: float | None = None
        self.wall = 0.0

    def start(self) -> None:
        import jax

        os.makedirs(self.folder, exist_ok=True)
        jax.profiler.start_trace(self.folder)
        self.started = time.perf_counter()

    def stop(self) -> str:
        """Stop tracing; the trace file written."""
        import jax

        assert self.started is not None, "the trace never started"
        self.wall = time.perf_counter() - self.started
        jax.profiler.stop_trace()
        pattern = os.path.join(self.folder, "**", "*.xplane.pb")
        found = sorted(glob.glob(pattern, recursive=True))
        if not found:
            raise RuntimeError(f"jax.profiler wrote no .xplane.pb under {self.folder}")
        return found[-1]


def by_name(events: Iterable) -> dict[str, tuple[int, int]]:
    """Each event name's `(total nanoseconds, count)`."""
    sums: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for event in events:
        sums[event.name][0] += event.duration_ns
        sums[event.name][1] += 1
    return {name: (ns, n) for name, (ns, n) in sums.items()}


def self_times(events: Iterable) -> dict[str, tuple[int, int]]:
    """Each event name's `(nanoseconds outside the events nested in it, count)`:
    the Python tracer's line nests a function's calls inside it."""
    sums: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    stack: list[list] = []  # [event, nanoseconds of its direct children]

    def close(entry: list) -> None:
        event, children = entry
        sums[event.name][0] += event.duration_ns - children
        sums[event.name][1] += 1

    for event in sorted(events, key=lambda e: (e.start_ns, -e.end_ns)):
        while stack and stack[-1][0].end_ns <= event.start_ns:
            close(stack.pop())
        if stack:
            stack[-1][1] += event.duration_ns
        stack.append([event, 0])
    while stack:
        close(stack.pop())
    return {name: (ns, n) for name, (ns, n) in sums.items()}


def _top(table: dict[str, tuple[int, int]], top: int, steps: int) -> list[str]:
    rows = sorted(table.items(), key=lambda kv: -kv[1][0])[:top]
    return [
        f"      {ns / steps / 1e3:10.1f} us/step {n / steps:7.2f}/step  {name[:90]}"
        for name, (ns, n) in rows
    ]


def summary(path: str, wall: float, steps: int, top: int) -> list[str]:
    """The trace at `path` summed: device busy share, top programs and ops, the
    host threads' top events."""
    from jax.profiler import ProfileData

    data = ProfileData.from_file(path)
    out = [f"    wall {wall / steps * 1e6:.1f} us a step ({steps} steps traced)"]
    hosts = []
    for plane in data.planes:
        lines = {line.name: list(line.events) for line in plane.lines}
        if plane.name.startswith("/device:"):
            modules = lines.get("XLA Modules", [])
            busy = merged_ns((e.start_ns, e.end_ns) for e in modules)
            out.append(
                f"    {plane.name}: programs busy {busy / 1e3 / steps:.1f} us a step, "
                f"{busy / 1e9 / wall:.1%} of the wall"
            )
            out.append("     programs:")
            out += _top(by_name(modules), top, steps)
            if "XLA Ops" in lines:
                out.append("     ops:")
                out += _top(by_name(lines["XLA Ops"]), top, steps)
        elif plane.name.startswith("/host:"):
            for name, events in lines.items():
                if events:
                    hosts.append((sum(e.duration_ns for e in events), name, events))
    for _, name, events in sorted(hosts, key=lambda h: -h[0])[:HOST_LINES_SHOWN]:
        # The profiler's own start and stop are traced too: left out, after each
        # event's own time is taken, so that the frames around the start (the
        # epoch-end hook that starts it) do not take its time as theirs.
        kept = {
            event: times
            for event, times in self_times(events).items()
            if "profiler.py" not in event and "device_trace.py" not in event
        }
        out.append(f"    host thread {name[:60]} (own time, nested events apart):")
        out += _top(kept, top, steps)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--workload", choices=[*sorted(WORKLOADS), "tiny_mlp"], default="tutorial_mlp"
    )
    parser.add_argument("--steps-per-call", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=3, help="epochs traced a side")
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--keep", metavar="DIR", help="write the traces here")
    parser.add_argument(
        "--source",
        choices=sorted(SOURCES),
        default="list",
        help="what feeds jaxnitro's sides",
    )
    args = parser.parse_args()
    print(banner())
    import jaxnitro as nx

    widths, batches = workload(args.workload)
    exp = make_experiment(widths, SOURCES[args.source](batches))

    class TracingLogger(nx.JSONLogger):
        """The default logger, which starts `trace` at the first epoch line."""

        def __init__(self, trace: Trace) -> None:
            super().__init__()
            self.trace = trace

        def log_epoch(self, row: dict) -> None:
            super().log_epoch(row)
            if row["epoch"] == 1:  # its compiles and its first epoch stay untraced
                self.trace.start()

    # The traces (unless --keep keeps them) and jaxnitro's run directories: removed
    # at the end (at the latest when the process exits).
    scratch = tempfile.TemporaryDirectory(prefix="nitro-trace-")
    root = args.keep or scratch.name
    steps = args.epochs * len(batches)

    ref_epochs, ref_first = reference_loop(widths, batches)
    ref_first()
    ref_epochs(1)
    scan_epoch = reference_scan(widths, batches, args.steps_per_call)
    scan_epoch()

    def scan() -> None:
        for _ in range(args.epochs):
            scan_epoch()

    def plain(run: Callable[[], None]) -> Callable[[Trace], None]:
        def side(trace: Trace) -> None:
            trace.start()
            run()

        return side

    def ours(k: int) -> Callable[[Trace], None]:
        def side(trace: Trace) -> None:
            nx.Nitro(
                exp(max_epochs=1 + args.epochs),
                run_dir=tempfile.mkdtemp(dir=scratch.name),
                checkpointer=None,
                logger=TracingLogger(trace),
                steps_per_call=k,
            ).train()

        return side

    sides = [
        ("hand-written loop", plain(lambda: ref_epochs(args.epochs))),
        (f"hand-written scan k={args.steps_per_call}", plain(scan)),
        *((f"jaxnitro k={k}", ours(k)) for k in sorted({1, args.steps_per_call})),
    ]
    with scratch:
        for name, side in sides:
            trace = Trace(os.path.join(root, name.replace(" ", "_").replace("=", "")))
            side(trace)
            path = trace.stop()
            print(f"{args.workload}, {name}:")
            print("\n".join(summary(path, trace.wall, steps, args.top)))


if __name__ == "__main__":
    main()
