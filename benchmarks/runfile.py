"""A run file through `sexpgpu run` against the same model on the Python API.

The minimal example's model, objective, optimizer and batches (2 micro-batches of 4
windows of 17 tokens a step, SGD at 0.5) are trained twice from the same seed:

- through the run file (`jaxnitro.runfile.running.run_file`, what `sexpgpu run`
  calls), in cadence blocks of 50 steps;
- as a hand-written `jaxnitro.Experiment`: the same GPT forward and cross-entropy,
  `optax.sgd`, the batches prebuilt as a list, 50 steps an epoch (`--same-source`:
  the run file's own train source instead, which isolates the data path).

Both keep one checkpoint an epoch and log to metrics.jsonl. The steady step rate is
the steps of every epoch but the first (which compiles) over their seconds, as the
loop times them (`history[i]["seconds"]`); the target is a ratio >= 0.95. The run
file's `data_wait_frac` (the share of the step spent waiting for a batch) is read
from its metrics.jsonl; `--realistic` adds realistic.sx's smoke variant for 30 steps,
whose data wait the issue bounds at 5%.

    python benchmarks/runfile.py [--blocks N] [--repeats R] [--realistic]

Each pair (run file and Python API, back to back, the first side alternating) is
repeated; the median of the paired ratios is reported, which cancels the slow
stretches of a shared machine, the ratio of each side's fastest block, which a
machine busy with other work disturbs least, and the ratio of the process CPU time
a steady step takes (the work each side does, whatever the wait for a core).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import tempfile
import time

from _common import banner

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "examples", "runfiles")
CADENCE = 50

RUN_FILE = """
(require "sexpgpu/nn" cross-entropy gpt)
(require "sexpgpu/optim" sgd)
(defvar train-loader
  (loader :sources [(files ["data/tiny-train.jsonl.gz"] :encoding "jsonl.gz")]
          :fields [(field :tokens :from "input_ids" :dtype :i32 :shape [17])]
          :batch-size 4
          :infinite true))
(defun prepare (batch)
  (let ((tokens (field batch :tokens)))
    (list :inputs (slice tokens 1 0 16) :targets (slice tokens 1 1 17))))
(defvar model (gpt :vocab 32 :layers 2 :dim 32 :heads 2))
(defun objective (prediction targets) (cross-entropy prediction targets))
(defvar optimizer (sgd :lr 0.5))
(defrun :steps STEPS :microbatches 2 :cadence CADENCE :precision :f32 :seed 1)
"""


def steady(history) -> float:
    """Steps a second over every epoch but the first."""
    rows = list(history)[1:]
    steps = rows[-1]["step"] - list(history)[0]["step"]
    return steps / sum(r["seconds"] for r in rows)


BEST: dict[str, float] = {}
"""Each side's fastest epoch (steps a second) over every run: on a shared machine
the least disturbed block, the rate the side reaches when it has the cores (the
estimator `timeit` uses)."""


class CPUClock:
    """The process CPU time at each epoch start and at the run's end (a phase
    monitor, the same instrument on both sides). CPU time counts the work a side
    does, where the wall clock on a shared machine also counts waiting for a core."""

    def __init__(self) -> None:
        self.marks: list[tuple[int, float]] = []

    def __call__(self, phase, step, epoch, info) -> None:
        import jaxnitro as nx

        if info.get("epoch_started") is not None or isinstance(phase, nx.Done):
            self.marks.append((int(step or 0), time.process_time()))

    def per_step(self) -> float:
        """CPU seconds a step from the second epoch's start to the end."""
        (s0, t0), (s1, t1) = self.marks[1], self.marks[-1]
        return (t1 - t0) / (s1 - s0)


def cpu_timed(run):
    """`run()` with a CPUClock registered; (its result, CPU seconds a step)."""
    import jaxnitro as nx

    clock = CPUClock()
    handle = nx.register_phase_monitor(clock)
    try:
        result = run()
    finally:
        nx.unregister_phase_monitor(handle)
    return result, clock.per_step()


def note_best(side: str, history) -> None:
    rows = list(history)
    pairs = zip(rows, rows[1:], strict=False)
    rates = [(b["step"] - a["step"]) / b["seconds"] for a, b in pairs]
    BEST[side] = max(BEST.get(side, 0.0), *rates)


def data_wait(run_dir: str) -> float:
    """The mean `data_wait_frac` the run logged."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as handle:
        rows = [json.loads(line) for line in handle]
    waits = [r["data_wait_frac"] for r in rows if r.get("context") == "data"]
    return statistics.mean(waits)


def write_run_file(folder: str, blocks: int) -> str:
    """The benchmark's run file for `blocks` cadence blocks; its path."""
    path = os.path.join(folder, "bench.sx")
    with open(path, "w") as handle:
        text = RUN_FILE.replace("STEPS", str(blocks * CADENCE))
        handle.write(text.replace("CADENCE", str(CADENCE)))
    return path


def train_source(folder: str, blocks: int):
    """The run file's train source (its cadence blocks), without training."""
    from jaxnitro.runfile.engine import compile_run

    return compile_run(write_run_file(folder, blocks)).splits()["train"]


def through_run_file(folder: str, blocks: int) -> tuple[float, float, list]:
    from jaxnitro.runfile.running import run_file

    path = write_run_file(folder, blocks)
    run_dir = os.path.join(folder, "runfile")
    outcome = run_file(path, run_dir=run_dir)
    note_best("runfile", outcome.handle.history)
    from jaxnitro.data.protocol import unwrap_source

    batches = unwrap_source(outcome.handle.data["train"])  # the cadence blocks
    return steady(outcome.handle.history), data_wait(run_dir), batches


def through_python_api(folder: str, blocks: int, source, *, same_source: bool) -> float:
    import jax
    import optax

    import jaxnitro as nx
    from jaxnitro.runfile.stdlib_nn import GPTSpec, nest

    spec = GPTSpec(vocab=32, layers=2, dim=32, heads=2, context=1024)
    epoch = [source.batch_at(i, 0) for i in range(2 * CADENCE)]

    class Direct(nx.Experiment):
        def build_data(self, dist):
            return {"train": source if same_source else epoch}

        def build_model(self, rng):
            return None, nest(spec.init(rng)), {}

        def forward(self, model, params, state, *, tokens):
            flat = {
                ".".join(str(getattr(k, "key", k)) for k in path): leaf
                for path, leaf in jax.tree_util.tree_leaves_with_path(params)
            }
            logits = spec.apply(flat, tokens[:, :16], None)
            return (logits, tokens[:, 1:]), state

        def loss(self, outputs):
            logits, targets = outputs
            losses = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
            return losses.mean()

        def optimizer(self):
            return optax.sgd

        def learning_rate(self, group=None):
            return 0.5

    handle = nx.Nitro(
        Direct(),
        seed=1,
        accum=2,
        max_epochs=blocks,
        run_dir=os.path.join(folder, "direct"),
        checkpointer=nx.Checkpointer(keep=nx.Last(1)),
    )
    history = handle.train().history
    note_best("python", history)
    return steady(history)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=12, help="epochs of 50 steps")
    parser.add_argument("--repeats", type=int, default=6, help="paired runs")
    parser.add_argument("--realistic", action="store_true")
    parser.add_argument(
        "--same-source",
        action="store_true",
        help="feed the Python API the run file's train source, not a list",
    )
    args = parser.parse_args()
    print(banner())
    folder = tempfile.mkdtemp(prefix="runfile-bench-")
    try:
        shutil.copytree(os.path.join(EXAMPLES, "data"), os.path.join(folder, "data"))
        ratios, waits, cpu_ratios = [], [], []
        for repeat in range(args.repeats):
            # Each pair runs both sides back to back, and the side that goes first
            # alternates: a side run second may find the machine warmer (caches,
            # the allocator), so a fixed order could bias the ratio. A collection
            # before each run keeps one side's garbage out of the other's timing.
            first = "runfile" if repeat % 2 == 0 else "python"

            def python_side(source):
                gc.collect()
                return cpu_timed(
                    lambda: through_python_api(
                        folder, args.blocks, source, same_source=args.same_source
                    )
                )

            if first == "python":
                from jaxnitro.data.protocol import unwrap_source

                # NoPrefetch on a CPU, the bare blocks on an accelerator
                source = unwrap_source(train_source(folder, args.blocks))
                direct, direct_cpu = python_side(source)
            gc.collect()
            (rate, wait, source), cpu = cpu_timed(
                lambda: through_run_file(folder, args.blocks)
            )
            if first == "runfile":
                direct, direct_cpu = python_side(source)
            ratios.append(rate / direct)
            cpu_ratios.append(direct_cpu / cpu)
            waits.append(wait)
            print(
                f"run file {rate:8.1f} steps/s, {cpu * 1e3:.3f} CPU ms a step "
                f"(data_wait_frac {wait:.4f}); python api {direct:8.1f} steps/s, "
                f"{direct_cpu * 1e3:.3f} CPU ms a step"
            )
        print(
            f"median ratio run file / python api: {statistics.median(ratios):.3f} "
            f"(target >= 0.95); median data_wait_frac {statistics.median(waits):.4f}"
        )
        print(
            "median ratio of CPU time a step, python api / run file: "
            f"{statistics.median(cpu_ratios):.3f}"
        )
        fastest = BEST["runfile"] / BEST["python"]
        print(
            f"fastest block: run file {BEST['runfile']:.1f} steps/s, python api "
            f"{BEST['python']:.1f} steps/s, ratio {fastest:.3f}"
        )
        if args.realistic:
            from jaxnitro.runfile.knobs import Selection
            from jaxnitro.runfile.running import run_file

            shutil.copy(os.path.join(EXAMPLES, "realistic.sx"), folder)
            run_dir = os.path.join(folder, "smoke")
            run_file(
                os.path.join(folder, "realistic.sx"),
                Selection(variant="smoke"),
                steps=30,
                run_dir=run_dir,
            )
            print(f"realistic smoke, 30 steps: data_wait_frac {data_wait(run_dir):.4f}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
