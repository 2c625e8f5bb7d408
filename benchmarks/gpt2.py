"""GPT-2 small three ways: a hand-written Flax NNX + Optax loop, jaxnitro's Python
API and the run file through `sexpgpu run`, interleaved in one process.

All three train the same module (`jaxnitro.runfile.nn_modules.GPT`) from the same
initial weights (`jax.random.key(seed)`) on the same batches (the run file's JSONL
loader, read once up front) with AdamW (betas 0.9, 0.95, eps 1e-8, weight decay 0.1
on the matrices only, a constant learning rate), one optimizer step a batch:

- the reference, written as the Flax guide "Performance considerations" recommends
  for a fast loop: `nnx.Optimizer`, then `nnx.split` of the model and optimizer
  once, and one `jax.jit` step that merges them, takes `nnx.value_and_grad` of the
  loss, updates and splits them again, with the state donated. Under bf16 the loss
  casts the float32 parameters to bfloat16 before the forward pass (f32 master
  weights and AdamW states) and the logits back to float32; the batches are placed
  on the device before the clock starts and the losses are read once a block;
- `examples/gpt2.py`'s experiment on the run file's own train source, with the run
  file's checkpoint (the latest kept) and log line every block;
- `examples/runfiles/gpt2.sx` through `jaxnitro.runfile.running.run_file`, what
  `sexpgpu run` calls.

Each side trains `--steps` steps in blocks of `--cadence` (the run file's cadence,
one engine epoch each); its steady rate is over every block but the first (which
compiles): the loop's own stepping time for jaxnitro (`history[i]["seconds"]`,
without the checkpoint writes) and its wall clock between block starts (with them).
Tokens a second are steps a second times batch x context. MFU is given two ways:
XLA's cost analysis of each side's step program, and the formula (6N + 12 L d T)
x tokens (N parameters, L blocks, d width, T context), both against the device's
bf16 dense peak (`jaxnitro.devices.peaks`; a CPU has none, so MFU is unknown there).
Device memory is XLA's analysis of each step program (arguments + outputs - aliased
+ temporaries) and, where the backend reports it, the process's peak so far.

`--remat none|blocks|dots` trains every side under that rematerialisation policy of
the module (`nn_modules.REMAT_POLICIES`: the reference builds `GPT(remat=...)`, the
Python API sets the experiment's `remat` field, the run file `--set remat=:...`).

`--attention auto|xla|flash|cudnn` picks how the jaxnitro sides' blocks compute their
causal attention (`nn_modules.ATTENTIONS`: the experiment's `attention` field, the run
file's `--set attention=:...`); "auto", the default as it is jaxnitro's, compiles to
"flash" on a TPU and "xla" elsewhere. The reference stays the plain hand-written loop
with the attention written out ("xla"), so where the jaxnitro sides compile to a
kernel each ratio to it is the kernel's gain as well as the framework's cost (the
ratio line says there is no target; `--attention xla` compares like with like), and
the exactness lines show the two attentions' rounding apart. "flash" is the Pallas
TPU flash attention kernel, "cudnn" cuDNN's fused attention (an NVIDIA GPU, bf16): on
another backend the script stops before any side runs, naming the backend.

`--loss-chunks N` computes the jaxnitro sides' training loss in N chunks of
positions (`nn_xent`: the experiment's `loss_chunks` field, the run file's `--set
loss-chunks=N`): the head's logits one chunk at a time, recomputed in the backward
pass, so the whole [batch, seq, vocab] logits never exist at once. N divides the
context; 0 (the default) is the whole logits. The reference stays the plain loop
with the whole logits, so each ratio to it holds the option's gain (or loss) beside
the framework's cost, and the exactness lines the two sums' rounding.

`--max-batch` measures memory instead of speed: for each side (`--sides`, all three by
default) the largest batch that fits, found by doubling from `--batch` up to
`--max-batch-cap` (256), then bisecting between the largest batch that fitted and the
smallest that ran out of memory (XLA's RESOURCE_EXHAUSTED, at the compile or a step);
each probe compiles and trains 2 steps from fresh weights, at most `--max-probes` (10)
a side. One line a side: the largest batch, the step program's memory there (XLA's
analysis) and the tokens/s of its second step. On a CPU it reaches the cap.

`--profile` trains the reference and the Python API once more each under
`jax.profiler` (their programs already compiled) and reads the traces back
(`_device_parts.py`): how busy the device was, how long it waited for the host, and
its ops' time by part of the step, told apart by the named scopes the model and the
step trace them under: attention, mlp, head, loss, optimizer, and the rest (the
embeddings, the norms, the residual adds). A CPU backend's trace has no device plane.

The exactness lines compare each jaxnitro side with the reference: the losses at the
logged steps (every block end; every step for the Python API with `--log-every 1`),
the block means, and the largest parameter difference at the end. `--resume-check`
also trains the run file to half the steps, resumes it to the end and compares it
with the uninterrupted run, bit for bit.

    python benchmarks/gpt2.py --config tiny                   # CPU: well under a minute
    python benchmarks/gpt2.py --config gpt2-small --resume-check     # an accelerator
    python benchmarks/gpt2.py --config gpt2-small --max-batch --remat blocks
    python benchmarks/gpt2.py --config gpt2-small --attention xla     # like for like
    python benchmarks/gpt2.py --config gpt2-small --attention cudnn   # a GPU
    python benchmarks/gpt2.py --config gpt2-small --loss-chunks 4
    python benchmarks/gpt2.py --config gpt2-small --steps 50 --cadence 25 --profile

GPT-2 small's data (2048 windows of 1025 tokens below 50304) is written on first
use with `examples/runfiles/make_data.py --gpt2` (a few seconds); the tiny windows
ship with the repository.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import glob
import importlib.util
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "examples")
RUNFILES = os.path.join(EXAMPLES, "runfiles")
SIDES = ("reference", "python api", "run file")


def load_script(path: str, name: str) -> Any:
    """A script outside any package as module `name` (registered in sys.modules:
    dataclasses and field docs look the module up)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def example() -> Any:
    """examples/gpt2.py: the Python API experiment and the configurations."""
    return load_script(os.path.join(EXAMPLES, "gpt2.py"), "gpt2_example")


@dataclass(frozen=True)
class Workload:
    """One configuration of the benchmark: sizes, batch, run length, precision."""

    config: str
    batch: int
    steps: int
    cadence: int
    precision: str = "bf16"
    seed: int = 1
    lr: float = 6e-4
    remat: str = "none"
    attention: str = "auto"
    """The jaxnitro sides' attention; the reference's is always "xla"."""
    platform: str = "cpu"
    """The JAX platform the sides compile for: what "auto" becomes there."""
    loss_chunks: int = 0
    """The jaxnitro sides' chunks of the training loss (0: the whole logits); the
    reference always takes the whole logits."""

    @property
    def sizes(self) -> dict[str, int]:
        """vocab, layers, width, heads, seq of the configuration."""
        sizes = dict(example().CONFIGS[self.config])
        sizes.pop("batch")
        return sizes

    @property
    def compiled_attention(self) -> str:
        """The jaxnitro sides' attention as compiled on `platform`."""
        from jaxnitro.runfile.nn_attention import compiled_attention

        return compiled_attention(self.attention, self.platform)

    def attention_line(self) -> str:
        """The attention as the report's workload line names it."""
        compiled = self.compiled_attention
        named = self.attention
        if named != compiled:
            named = f"{named}: {compiled} on {self.platform}"
        if compiled == "xla":
            return f"attention {named}"
        return f"attention {named} (the reference's: xla)"

    def loss_line(self) -> str:
        """The loss chunks as the report's workload line names them."""
        if not self.loss_chunks:
            return "loss chunks 0"
        return f"loss chunks {self.loss_chunks} (the reference's: 0)"

    def target(self) -> str:
        """The tokens/s ratio's target, or why there is none: a jaxnitro option
        the reference does not take makes the ratio measure the option too."""
        differ = []
        if self.compiled_attention != "xla":
            differ.append(
                f"{self.compiled_attention} attention against the reference's xla"
            )
        if self.loss_chunks:
            differ.append(
                f"loss in {self.loss_chunks} chunks against the reference's whole "
                "logits"
            )
        return f"no target: {'; '.join(differ)}" if differ else "target >= 0.98"

    @property
    def tokens_per_step(self) -> int:
        return self.batch * self.sizes["seq"]

    def selection(self) -> Any:
        """The run file's variant and `--set` values for this workload."""
        from jaxnitro.runfile.knobs import Selection

        sets = {
            "batch": self.batch,
            "steps": self.steps,
            "cadence": self.cadence,
            "precision": f":{self.precision}",
            "remat": f":{self.remat}",
            "attention": f":{self.attention}",
            "loss-chunks": self.loss_chunks,
            "seed": self.seed,
            "lr": self.lr,
        }
        variant = "tiny" if self.config == "tiny" else None
        return Selection(
            variant=variant, sets=tuple((k, str(v)) for k, v in sets.items())
        )


@dataclass
class Side:
    """What one side's run gave: timing, losses, final parameters, costs."""

    name: str
    step_seconds: float
    """Steady seconds a step, stepping only (blocks after the first)."""
    wall_seconds: float
    """Steady seconds a step by the wall clock between block starts."""
    logged: dict[int, float]
    """step -> that step's loss, at the steps the side reports one."""
    block_means: list[float]
    params: dict[str, Any] = field(repr=False)
    """The final parameters by the run file's dotted names, on the host."""
    flops: float | None = None
    memory: int | None = None
    """XLA's memory analysis of the step program, in bytes."""
    data_wait: list[float] = field(default_factory=list)
    """Each epoch's data_wait_frac after the first (jaxnitro sides)."""


def prepare_folder(folder: str, config: str) -> str:
    """gpt2.sx and the data its `config` reads, in `folder`; the run file's path."""
    shutil.copy(os.path.join(RUNFILES, "gpt2.sx"), folder)
    data = os.path.join(folder, "data")
    os.makedirs(data, exist_ok=True)
    if config == "tiny":
        shutil.copy(os.path.join(RUNFILES, "data", "train.jsonl.gz"), data)
        return os.path.join(folder, "gpt2.sx")
    written = os.path.join(RUNFILES, "data", "gpt2")
    if not os.path.exists(os.path.join(written, "train.jsonl.gz")):
        make_data = load_script(os.path.join(RUNFILES, "make_data.py"), "make_data")
        make_data.main(RUNFILES, gpt2=True, shipped=False)
    shutil.copytree(written, os.path.join(data, "gpt2"))
    return os.path.join(folder, "gpt2.sx")


def run_batches(path: str, work: Workload) -> tuple[Any, list[Any]]:
    """The run file's train source (its cadence blocks) and each step's tokens
    int32[batch, seq + 1], in order."""
    from jaxnitro.data.protocol import unwrap_source
    from jaxnitro.runfile.engine import compile_run

    blocks = unwrap_source(compile_run(path, work.selection()).splits()["train"])
    tokens = [
        blocks.batch_at(i, epoch)["tokens"]
        for epoch, count in enumerate(blocks.blocks)
        for i in range(count)
    ]
    return blocks, tokens


def by_name(state: Any) -> dict[str, Any]:
    """An NNX parameter state by the run file's dotted names, on the host."""
    import numpy as np
    from flax import nnx

    from jaxnitro.runfile.nn_models import parameter_name

    return {
        parameter_name(path): np.asarray(variable[...])
        for path, variable in nnx.to_flat_state(state)
    }


_REFERENCE_STEPS: dict[tuple[Any, ...], Any] = {}
"""The reference's jitted step by (graphdef, precision): a repeat reuses it, as a
script training twice would, so only the first run compiles."""


def reference(work: Workload, tokens: list[Any], *, rewritten: bool = False) -> Side:
    """The hand-written Flax NNX + Optax loop over `tokens`, one step each.

    `rewritten`: the same loop with its cross-entropy written through
    `jax.nn.log_softmax` instead of Optax's, the same mathematics rounded
    differently in the last bits: how far two equal programs drift apart in this
    precision over the run (the yardstick for the jaxnitro sides' gaps)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax import nnx

    from jaxnitro.runfile.nn_modules import GPT

    ex = example()
    model = GPT(
        **_positional(work.sizes),
        remat=work.remat,
        attention="xla",
        rngs=nnx.Rngs(params=jax.random.key(work.seed)),
    )
    tx = optax.adamw(
        work.lr,
        b1=ex.ADAMW["b1"],
        b2=ex.ADAMW["b2"],
        eps=ex.ADAMW["eps"],
        weight_decay=ex.ADAMW["weight_decay"],
        mask=lambda params: jax.tree.map(lambda p: p.ndim >= 2, params),
    )
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    graphdef, state = nnx.split((model, optimizer))
    compute = jnp.bfloat16 if work.precision == "bf16" else None

    def train_step(graphdef: Any, state: Any, tokens: Any) -> Any:
        model, optimizer = nnx.merge(graphdef, state)

        def loss_fn(model: Any) -> Any:
            if compute is not None:  # bf16 compute from the f32 master weights
                structure, params = nnx.split(model)
                model = nnx.merge(
                    structure, jax.tree.map(lambda p: p.astype(compute), params)
                )
            logits = model(tokens[:, :-1]).astype(jnp.float32)
            if rewritten:  # the log-probability of each next token, then its mean
                logp = jax.nn.log_softmax(logits)
                picked = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)
                return -picked.mean()
            with jax.named_scope("loss"):  # the scopes jaxnitro's profile parts use
                losses = optax.softmax_cross_entropy_with_integer_labels(
                    logits, tokens[:, 1:]
                )
                return losses.mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        with jax.named_scope("optimizer"):
            optimizer.update(model, grads)
        return loss, nnx.state((model, optimizer))

    key = (graphdef, work.precision, rewritten)
    step = _REFERENCE_STEPS.get(key)
    if step is None:
        step = _REFERENCE_STEPS[key] = jax.jit(train_step, donate_argnums=1)
    placed = [jax.device_put(t) for t in tokens]  # on the device before the clock
    jax.block_until_ready(placed)
    losses: list[float] = []
    starts = []
    for start in range(0, len(placed), work.cadence):
        starts.append(time.perf_counter())
        block = []
        for batch in placed[start : start + work.cadence]:
            loss, state = step(graphdef, state, batch)
            block.append(loss)
        losses.extend(np.asarray(jax.device_get(block), np.float64).tolist())
    starts.append(time.perf_counter())
    compiled = step.lower(graphdef, state, placed[0]).compile()  # cached: no compile
    steady = (starts[-1] - starts[1]) / (len(placed) - work.cadence)
    model, _ = nnx.merge(graphdef, state)
    return Side(
        "reference",
        steady,
        steady,
        {i + 1: loss for i, loss in enumerate(losses)},
        _block_means(losses, work.cadence),
        by_name(nnx.state(model, nnx.Param)),
        _flops(compiled),
        _memory(compiled),
    )


def _positional(sizes: dict[str, int]) -> dict[str, int]:
    """`GPT`'s keyword arguments of a configuration's sizes."""
    return {
        "vocab": sizes["vocab"],
        "layers": sizes["layers"],
        "dim": sizes["width"],
        "heads": sizes["heads"],
        "context": sizes["seq"],
    }


def _block_means(losses: list[float], cadence: int) -> list[float]:
    return [
        statistics.fmean(losses[i : i + cadence])
        for i in range(0, len(losses), cadence)
    ]


def _flops(executable: Any) -> float | None:
    from jaxnitro.compile.costs import program_costs

    return program_costs(executable)[0]


def _memory(executable: Any) -> int | None:
    """Arguments + outputs - aliased (donated) + temporaries, by XLA's analysis."""
    try:
        m = executable.memory_analysis()
        return int(
            m.argument_size_in_bytes
            + m.output_size_in_bytes
            - m.alias_size_in_bytes
            + m.temp_size_in_bytes
        )
    except Exception:  # a backend without the analysis
        return None


class BlockClock:
    """The wall clock at each block (epoch) start and at the run's end: a phase
    monitor, so checkpoint writes and logging between blocks are counted."""

    def __init__(self) -> None:
        self.marks: list[tuple[int, float]] = []

    def __call__(self, phase: Any, step: Any, epoch: Any, info: Any) -> None:
        import jaxnitro as nx

        if info.get("epoch_started") is not None or isinstance(phase, nx.Done):
            self.marks.append((int(step or 0), time.perf_counter()))

    def steady(self) -> float:
        """Wall seconds a step from the second block's start to the end."""
        (s0, t0), (s1, t1) = self.marks[1], self.marks[-1]
        return (t1 - t0) / (s1 - s0)


def clocked(run: Any) -> tuple[Any, float]:
    """`run()` with a BlockClock registered; its result and the steady wall time."""
    import jaxnitro as nx

    clock = BlockClock()
    handle = nx.register_phase_monitor(clock)
    try:
        result = run()
    finally:
        nx.unregister_phase_monitor(handle)
    return result, clock.steady()


def jaxnitro_side(name: str, nitro: Any, wall: float, work: Workload) -> Side:
    """A Side of a trained jaxnitro handle: its history, log lines and programs."""
    from jaxnitro.run.costs import cost_rows, step_costs

    history = list(nitro.history)
    stepped = sum(row["seconds"] for row in history[1:])
    steady = stepped / (history[-1]["step"] - history[0]["step"])
    costs = step_costs(cost_rows(nitro), 1)
    programs = dict(nitro.executables.compiled())
    return Side(
        name,
        steady,
        wall,
        _logged_losses(os.path.join(nitro.run_dir, "metrics.jsonl")),
        [row["train_loss"] for row in history],
        final_params(nitro),
        None if costs is None else costs[0],
        _memory(programs.get("train_step")),
        _data_waits(os.path.join(nitro.run_dir, "metrics.jsonl")),
    )


def final_params(nitro: Any) -> dict[str, Any]:
    """A handle's parameters by the run file's dotted names, on the host."""
    import numpy as np

    from jaxnitro.runfile.stdlib_nn import flatten

    params = nitro.train_state.params
    if isinstance(params, dict):  # the run file's tree, nested by dotted names
        return {k: np.asarray(v) for k, v in flatten(params).items()}
    return by_name(params)


def _lines_with(path: str, context: str, key: str) -> list[dict[str, Any]]:
    """The lines of a run's metrics.jsonl of `context` that carry `key`."""
    with open(path) as lines:
        rows = [json.loads(line) for line in lines]
    return [row for row in rows if row.get("context") == context and key in row]


def _logged_losses(path: str) -> dict[int, float]:
    """step -> loss of each train line a run's metrics.jsonl holds."""
    return {
        int(row["step"]): float(row["loss"])
        for row in _lines_with(path, "train", "loss")
    }


def _data_waits(path: str) -> list[float]:
    """Each epoch's data_wait_frac a run's metrics.jsonl holds, the first epoch's
    (its compiles, the first batches' decoding) left out."""
    waits = {
        int(row["epoch"]): float(row["data_wait_frac"])
        for row in _lines_with(path, "data", "data_wait_frac")
    }
    return [frac for epoch, frac in sorted(waits.items()) if epoch > 1]


def python_api(
    work: Workload, source: Any, run_dir: str, *, log_every: int | None = None
) -> Side:
    """examples/gpt2.py's experiment on the run file's train source."""
    import jaxnitro as nx

    ex = example()
    experiment = ex.GPT2(
        **work.sizes,
        batch=work.batch,
        lr=work.lr,
        remat=work.remat,
        attention=work.attention,
        loss_chunks=work.loss_chunks,
        train=source,
    )
    blocks = len(source.blocks)

    def run() -> Any:
        return nx.Nitro(
            experiment,
            seed=work.seed,
            max_epochs=blocks,
            precision=work.precision,
            run_dir=run_dir,
            log_every_n_steps=log_every or work.cadence,
            checkpointer=nx.Checkpointer(keep=nx.Last(1)),  # the run file's
        ).train()

    nitro, wall = clocked(run)
    side = jaxnitro_side("python api", nitro, wall, work)
    nitro.release()
    return side


def run_file_side(path: str, work: Workload, run_dir: str, **kwargs: Any) -> Side:
    """gpt2.sx through `run_file`, what `sexpgpu run` calls."""
    from jaxnitro.runfile.running import run_file

    outcome, wall = clocked(
        lambda: run_file(path, work.selection(), run_dir=run_dir, **kwargs)
    )
    side = jaxnitro_side("run file", outcome.handle, wall, work)
    outcome.handle.release()
    return side


NO_GRADIENT = ".attn.key.bias"
"""The parameters whose gradient is zero in exact arithmetic: the attention key's
bias adds one constant to every score of a query, which softmax cancels. What they
get is rounding noise, which Adam scales to steps of the learning rate, so two runs
agree on them only as far as their rounding does."""


def largest_difference(
    a: dict[str, Any], b: dict[str, Any], *, noise: bool = False
) -> tuple[float, str]:
    """The largest |a - b| over the parameters (those NO_GRADIENT names when
    `noise`, the others otherwise), and the parameter's name."""
    import numpy as np

    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    gaps = {
        name: float(np.max(np.abs(np.asarray(a[name], np.float64) - ref)))
        for name, ref in b.items()
        if name.endswith(NO_GRADIENT) == noise
    }
    worst = max(gaps, key=gaps.__getitem__)
    return gaps[worst], worst


def loss_gaps(side: Side, ref: Side) -> tuple[float, float]:
    """The largest relative loss gap at `side`'s logged steps, and over the block
    means."""
    at = max(
        abs(v - ref.logged[s]) / abs(ref.logged[s]) for s, v in side.logged.items()
    )
    means = max(
        abs(a - b) / abs(b)
        for a, b in zip(side.block_means, ref.block_means, strict=True)
    )
    return at, means


def parameter_count(params: dict[str, Any]) -> int:
    return sum(int(v.size) for v in params.values())


def formula_flops(work: Workload, parameters: int) -> float:
    """(6N + 12 L d T) FLOPs a token, times the tokens of a step."""
    s = work.sizes
    per_token = 6 * parameters + 12 * s["layers"] * s["width"] * s["seq"]
    return float(per_token * work.tokens_per_step)


def _si(value: float) -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}"
    return f"{value:.3g} "


def report(work: Workload, runs: list[dict[str, Side]]) -> None:
    """Print tokens a second, ratios, MFU, memory and the exactness lines."""
    import jax

    from jaxnitro.devices.peaks import peak_flops

    device = jax.devices()[0]
    peak = peak_flops(device.device_kind)
    last = runs[-1]
    n = parameter_count(last["reference"].params)
    formula = formula_flops(work, n)
    print(
        f"workload: {work.config}, {n / 1e6:.1f}M parameters, batch {work.batch} x "
        f"{work.sizes['seq']} tokens, {work.steps} steps in blocks of {work.cadence}, "
        f"{work.precision}, remat {work.remat}, {work.attention_line()}, "
        f"{work.loss_line()}"
    )
    for name in SIDES:
        rates = [work.tokens_per_step / run[name].step_seconds for run in runs]
        walls = [work.tokens_per_step / run[name].wall_seconds for run in runs]
        side = last[name]
        line = (
            f"{name:>10}: {statistics.median(rates):10.1f} tokens/s stepping, "
            f"{statistics.median(walls):10.1f} by the wall clock "
            f"({side.step_seconds * 1e3:.1f} ms a step)"
        )
        if peak is None:
            line += f"; MFU unknown: no peak on record for {device.device_kind!r}"
        else:
            xla = (side.flops or 0.0) / side.step_seconds / peak
            by_formula = formula / side.step_seconds / peak
            line += f"; MFU {xla:.1%} by XLA's analysis, {by_formula:.1%} by formula"
        print(line)
    target = work.target()
    for name in SIDES[1:]:
        ratios = [
            run["reference"].step_seconds / run[name].step_seconds for run in runs
        ]
        walls = [run["reference"].wall_seconds / run[name].wall_seconds for run in runs]
        print(
            f"{name} / reference tokens/s: {statistics.median(ratios):.3f} stepping "
            f"({', '.join(f'{r:.3f}' for r in ratios)}), "
            f"{statistics.median(walls):.3f} by the wall clock ({target})"
        )
    print(
        "step FLOPs: "
        + ", ".join(
            f"{name} {_si(last[name].flops) + 'FLOP' if last[name].flops else 'n/a'}"
            for name in SIDES
        )
        + f"; formula {_si(formula)}FLOP"
    )
    print(
        "step program memory (XLA's analysis): "
        + ", ".join(
            f"{name} {last[name].memory / 2**20:.1f} MiB"
            if last[name].memory is not None
            else f"{name} n/a"
            for name in SIDES
        )
    )
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and "peak_bytes_in_use" in stats:
        print(
            f"device memory: peak {stats['peak_bytes_in_use'] / 2**30:.2f} GiB in "
            f"this process (all sides), {stats['bytes_in_use'] / 2**30:.2f} GiB in "
            f"use now"
        )
    else:
        print(f"device memory: not reported by the {device.platform} backend")
    ref = last["reference"]
    for name in SIDES[1:]:
        at, means = loss_gaps(last[name], ref)
        gap, where = largest_difference(last[name].params, ref.params)
        noise, _ = largest_difference(last[name].params, ref.params, noise=True)
        print(
            f"{name} vs reference: loss at {len(last[name].logged)} logged steps "
            f"within {at:.2e} (relative), block means within {means:.2e}; "
            f"parameters within {gap:.2e} (absolute, largest in {where}; the "
            f"gradient-free key biases within {noise:.2e})"
        )
    for name in SIDES[1:]:
        waits = last[name].data_wait
        if waits:
            print(
                f"{name} data_wait_frac: median {statistics.median(waits):.2%}, "
                f"largest {max(waits):.2%} over {len(waits)} epochs after the first "
                f"(target <= 2%)"
            )
    gap, where = largest_difference(last["run file"].params, last["python api"].params)
    print(f"run file vs python api: parameters within {gap:.2e} (in {where})")


def report_yardstick(
    work: Workload, rewritten: Side, ref: Side, steps: Iterable[int]
) -> None:
    """How far the reference drifts from itself rewritten (`reference`), its loss
    compared at `steps` (those the jaxnitro sides logged)."""
    at_steps = dataclasses.replace(
        rewritten, logged={s: rewritten.logged[s] for s in steps}
    )
    at, means = loss_gaps(at_steps, ref)
    gap, where = largest_difference(rewritten.params, ref.params)
    print(
        f"reference vs itself with its cross-entropy through log_softmax, {work.steps} "
        f"{work.precision} steps (the drift of two equal programs): loss at "
        f"{len(at_steps.logged)} logged steps within {at:.2e} (relative), block means "
        f"within {means:.2e}; parameters within {gap:.2e} (absolute, in {where})"
    )


def report_resumed(work: Workload, resumed: float) -> None:
    """The resume check's verdict line."""
    half = work.steps // 2 // work.cadence * work.cadence
    verdict = "bitwise equal" if resumed == 0.0 else f"differ by {resumed:.2e}"
    print(f"run file resumed at step {half}: final parameters {verdict}")


def resume_check(path: str, work: Workload, folder: str, whole: Side) -> float:
    """Train the run file to half the steps (whole blocks), resume it to the end;
    the largest parameter difference against the uninterrupted run (0.0: bitwise)."""
    from jaxnitro.runfile.running import run_file

    # The sides' handles may sit in reference cycles holding their device state
    # (2.6 GB at GPT-2 small): collected first, or the next run finds no room.
    gc.collect()
    run_dir = os.path.join(folder, "resumed")
    half = (work.steps // 2 // work.cadence) * work.cadence
    run_file(path, work.selection(), run_dir=run_dir, steps=half).handle.release()
    gc.collect()
    outcome = run_file(path, work.selection(), run_dir=run_dir, resume=True)
    resumed = final_params(outcome.handle)
    outcome.handle.release()
    return max(
        largest_difference(resumed, whole.params, noise=noise)[0]
        for noise in (False, True)
    )


def probe_side(name: str, path: str, work: Workload, folder: str) -> Side:
    """Train one side `work.steps` steps at `work.batch` from fresh weights (each
    probe of the largest-batch search)."""
    run_dir = os.path.join(folder, f"{name.replace(' ', '-')}-{work.batch}")
    try:
        source, tokens = run_batches(path, work)
        if name == "reference":
            return reference(work, tokens)
        if name == "python api":
            return python_api(work, source, run_dir)
        return run_file_side(path, work, run_dir)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def max_batch(
    path: str, work: Workload, sides: list[str], folder: str, *, cap: int, probes: int
) -> None:
    """Print, for each of `sides`, the largest batch that fits (see the module
    doc), the step program's memory there and the tokens/s of its second step."""
    import jax
    from _largest_batch import largest_batch

    print(
        f"largest batch: {work.config}, {work.sizes['seq']} tokens a window, "
        f"{work.precision}, remat {work.remat}, {work.attention_line()}, "
        f"{work.loss_line()}; from "
        f"{work.batch}, doubling to "
        f"{cap} then bisecting, at most {probes} probes a side, 2 steps each",
        flush=True,
    )
    found: dict[str, int | None] = {}
    for name in sides:

        def probe(batch: int, name: str = name) -> Side:
            side = probe_side(
                name,
                path,
                dataclasses.replace(work, batch=batch, steps=2, cadence=1),
                folder,
            )
            print(f"  {name} batch {batch}: fits", flush=True)
            return side

        search = largest_batch(probe, start=work.batch, cap=cap, max_probes=probes)
        found[name] = search.batch
        line = f"{name:>10}: "
        if search.batch is None:
            line += "no batch fits"
        else:
            side: Side = search.result
            tokens = search.batch * work.sizes["seq"]
            memory = "n/a" if side.memory is None else f"{side.memory / 2**30:.2f} GiB"
            line += (
                f"largest batch {search.batch}, step program {memory} (XLA's "
                f"analysis), {tokens / side.step_seconds:.1f} tokens/s"
            )
        print(f"{line} ({search.describe()})", flush=True)
        gc.collect()
    reference_batch = found.get("reference")
    for name in sides:
        if name != "reference" and reference_batch and found[name] is not None:
            print(
                f"{name} / reference largest batch: "
                f"{found[name] / reference_batch:.3f} (target >= 0.95)"
            )
    device = jax.devices()[0]
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and "peak_bytes_in_use" in stats:
        print(
            f"device memory: peak {stats['peak_bytes_in_use'] / 2**30:.2f} GiB in "
            f"this process (every probe), limit "
            f"{stats.get('bytes_limit', 0) / 2**30:.2f} GiB"
        )


def refuse_attention(work: Workload) -> None:
    """Stop before any side runs when the jaxnitro sides' attention does not
    compile on this backend (flash off a TPU, cudnn off a GPU), with the module's
    message."""
    from jaxnitro.runfile.nn_attention import check_attention_backend

    try:
        check_attention_backend(work.attention, "--attention", "--attention xla")
    except ValueError as error:
        raise SystemExit(str(error)) from None


def refuse_loss_chunks(work: Workload) -> None:
    """Stop before any side runs when `--loss-chunks` is not 0 or a divisor of
    the configuration's context, with the module's message."""
    from jaxnitro.runfile.nn_xent import check_loss_chunks

    try:
        check_loss_chunks(
            work.loss_chunks, work.sizes["seq"], "--loss-chunks", "--loss-chunks {}"
        )
    except ValueError as error:
        raise SystemExit(str(error)) from None


def profile(work: Workload, tokens: list[Any], source: Any, folder: str) -> None:
    """`--profile`: the reference and the Python API trained once more each under
    `jax.profiler`, their device time by part of the model (`_device_parts`)."""
    import jax
    from _device_parts import device_parts

    print(
        f"profile, {work.steps} steps a side (programs compiled before): device time "
        "by part, named scopes of the model and the step"
    )
    for name in ("reference", "python api"):
        gc.collect()
        trace = os.path.join(folder, f"trace-{name.replace(' ', '-')}")
        start = time.perf_counter()
        jax.profiler.start_trace(trace)
        try:
            if name == "reference":
                reference(work, tokens)
            else:
                python_api(work, source, os.path.join(folder, "profiled-api"))
        finally:
            jax.profiler.stop_trace()
        wall = time.perf_counter() - start
        found = sorted(
            glob.glob(os.path.join(trace, "**", "*.xplane.pb"), recursive=True)
        )
        print(f"  {name}: {wall / work.steps * 1e3:.1f} ms a step traced, setup in")
        print("\n".join(device_parts(found[-1], wall, work.steps)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=("tiny", "gpt2-small"), default="tiny")
    parser.add_argument("--batch", type=int, default=None, help="windows a step")
    parser.add_argument("--steps", type=int, default=None, help="steps each run")
    parser.add_argument("--cadence", type=int, default=None, help="steps a block")
    parser.add_argument("--precision", choices=("bf16", "f32"), default="bf16")
    parser.add_argument("--repeats", type=int, default=1, help="interleaved runs")
    parser.add_argument("--log-every", type=int, default=None, metavar="N")
    parser.add_argument("--resume-check", action="store_true")
    parser.add_argument(
        "--yardstick",
        action="store_true",
        help="also run the reference with its cross-entropy rewritten (equal "
        "mathematics, other roundings): how far equal programs drift apart",
    )
    parser.add_argument(
        "--remat",
        choices=("none", "blocks", "dots"),
        default="none",
        help="the module's rematerialisation policy, on every side",
    )
    parser.add_argument(
        "--attention",
        choices=("auto", "xla", "flash", "cudnn"),
        default="auto",
        help="the jaxnitro sides' attention (auto: flash on a TPU, xla elsewhere; "
        "flash: the Pallas TPU kernel, a TPU only; cudnn: cuDNN's fused attention, "
        "an NVIDIA GPU only); the reference's stays xla",
    )
    parser.add_argument(
        "--loss-chunks",
        type=int,
        default=0,
        metavar="N",
        help="the jaxnitro sides' training loss in N chunks of positions (N divides "
        "the context; 0: the whole logits); the reference's stays whole",
    )
    parser.add_argument(
        "--max-batch",
        action="store_true",
        help="find each side's largest batch instead of timing --steps",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also trace one more run of the reference and the Python API: device "
        "time by part (attention, mlp, head, loss, optimizer) and the host's gaps",
    )
    parser.add_argument("--max-batch-cap", type=int, default=256, metavar="B")
    parser.add_argument("--max-probes", type=int, default=10, metavar="N")
    parser.add_argument(
        "--sides",
        default="reference,python-api,run-file",
        help="with --max-batch: the sides to search, comma-separated",
    )
    args = parser.parse_args()
    small = args.config == "tiny"
    work = Workload(
        args.config,
        batch=args.batch or example().CONFIGS[args.config]["batch"],
        steps=args.steps or (60 if small else 200),
        cadence=args.cadence or (20 if small else 50),
        precision=args.precision,
        remat=args.remat,
        attention=args.attention,
        loss_chunks=args.loss_chunks,
    )
    sides = [s.strip().replace("-", " ") for s in args.sides.split(",")]
    if args.max_batch and set(sides) - set(SIDES):
        names = ", ".join(s.replace(" ", "-") for s in SIDES)
        raise SystemExit(f"--sides takes names among {names}, got {args.sides!r}")
    if work.steps % work.cadence or work.steps < 2 * work.cadence:
        raise SystemExit("--steps must be a multiple of --cadence, two blocks or more")
    import jax
    from _common import banner

    print(banner())
    work = dataclasses.replace(work, platform=jax.default_backend())
    refuse_attention(work)
    refuse_loss_chunks(work)
    folder = tempfile.mkdtemp(prefix="gpt2-bench-")
    try:
        path = prepare_folder(folder, args.config)
        if args.max_batch:
            max_batch(
                path,
                work,
                sides,
                folder,
                cap=args.max_batch_cap,
                probes=args.max_probes,
            )
            return
        source, tokens = run_batches(path, work)
        runs = []
        for repeat in range(args.repeats):
            # Each side in turn, the first rotating, a collection before each.
            order = SIDES[repeat % 3 :] + SIDES[: repeat % 3]
            run: dict[str, Side] = {}
            for name in order:
                gc.collect()
                where = os.path.join(folder, f"{name.replace(' ', '-')}-{repeat}")
                if name == "reference":
                    run[name] = reference(work, tokens)
                elif name == "python api":
                    run[name] = python_api(
                        work, source, where, log_every=args.log_every
                    )
                else:
                    run[name] = run_file_side(path, work, where)
                print(
                    f"repeat {repeat + 1}: {name} "
                    f"{work.tokens_per_step / run[name].step_seconds:.1f} tokens/s",
                    flush=True,
                )
            runs.append(run)
        report(work, runs)  # before the resume check, which may fail on its own
        if args.yardstick:
            gc.collect()
            rewritten = reference(work, tokens, rewritten=True)
            last = runs[-1]
            report_yardstick(
                work, rewritten, last["reference"], last["python api"].logged
            )
        if args.profile:
            profile(work, tokens, source, folder)
        if args.resume_check:
            report_resumed(work, resume_check(path, work, folder, runs[-1]["run file"]))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
