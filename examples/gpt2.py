"""GPT-2 small on the Python API: the run file's Flax NNX module, trained with AdamW
in bf16 on token windows from a JSONL file.

    python examples/gpt2.py [--config tiny|gpt2-small] [--steps N] [--batch B]
                            [--remat none|blocks|dots]
                            [--attention xla|flash|cudnn]
                            [--loss-chunks N]

The model is `jaxnitro.runfile.nn_modules.GPT`, the module behind the run file's
`gpt` (examples/runfiles/gpt2.sx trains the same one): learned token and position
embeddings, pre-norm blocks with causal attention and a GELU MLP, an untied head.
Its sizes are GraphConst fields, so the `tiny` configuration (2 blocks of width 64,
context 64, vocabulary 256) and GPT-2 small (12 blocks of width 768 with 12 heads,
context 1024, vocabulary 50304: 163M parameters) are the same code.

The forward and backward passes run in bfloat16 with float32 master weights and
AdamW states (`precision="bf16"`); AdamW is `optax.adam` with the framework's
decoupled weight decay of 0.1, which leaves the rank-1 parameters (biases and norm
scales) alone, as GPT-2 does. The data are the run file's: windows of seq + 1 tokens
read from examples/runfiles/data/ (`make_data.py --gpt2` writes GPT-2 small's; the
tiny windows ship), shuffled each epoch from the run seed. benchmarks/gpt2.py trains
this experiment on the run file's own batches beside the run file and a hand-written
Flax NNX + Optax loop. NITRO_RUN_DIR (default runs/gpt2) says where it writes.

`remat` trades compute for memory: "blocks" recomputes each block's forward pass in
the backward pass (keeping only its input), "dots" keeps the outputs of the linear
layers and recomputes the rest, "none" (the default) recomputes nothing. The loss
and the gradient are the same; a larger batch fits.

`attention` picks how the blocks compute their causal attention: "auto" (the default)
is "flash" on a TPU and "xla" elsewhere, chosen when the program is compiled for its
backend; "xla" writes it out in JAX, which XLA compiles on any backend; "flash" calls
the Pallas TPU flash attention kernel (`jaxnitro.runfile.nn_flash`), which compiles
for a TPU only; "cudnn" calls cuDNN's fused attention (`jaxnitro.runfile.nn_cudnn`),
on an NVIDIA GPU only and in bf16. On another backend `build_model` refuses either
kernel named outright (ConfigError) before anything compiles.

`loss_chunks` (0, the default, or a divisor of `seq`) computes the training loss in
that many chunks of positions (`jaxnitro.runfile.nn_xent`): in training `forward`
returns the head's input and weight instead of the logits, and `loss` multiplies
one chunk by the head at a time, recomputing it in the backward pass, so the whole
[batch, seq, vocab] logits (3.3 GB in float32 at GPT-2 small) never exist at once.
The loss and the gradient are the same up to rounding; evaluation, prediction and
export see the logits as before.
"""

from __future__ import annotations

import argparse
import functools
import gzip
import json
import os
from typing import Any

import numpy as np
import optax
from flax import nnx

import jaxnitro as nx
from jaxnitro.runfile.nn_attention import check_attention_backend
from jaxnitro.runfile.nn_modules import GPT, check_attention, check_remat
from jaxnitro.runfile.nn_xent import check_loss_chunks, token_cross_entropy

RUNFILES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runfiles")

CONFIGS: dict[str, dict[str, int]] = {
    "tiny": {"vocab": 256, "layers": 2, "width": 64, "heads": 2, "seq": 64, "batch": 4},
    "gpt2-small": {
        "vocab": 50304,
        "layers": 12,
        "width": 768,
        "heads": 12,
        "seq": 1024,
        "batch": 16,
    },
}
"""The sizes of each configuration: gpt2.sx's `tiny` variant and its defaults."""

DATA = {
    "tiny": os.path.join(RUNFILES, "data", "train.jsonl.gz"),
    "gpt2-small": os.path.join(RUNFILES, "data", "gpt2", "train.jsonl.gz"),
}
"""The windows each configuration reads (the files gpt2.sx reads)."""

ADAMW = {"b1": 0.9, "b2": 0.95, "eps": 1e-8, "weight_decay": 0.1}
"""AdamW's settings, gpt2.sx's."""


def read_windows(path: str) -> np.ndarray:
    """The token windows of a JSONL file of `{"input_ids": [...]}` lines (gzip when
    the name ends in .gz): int32[windows, tokens a window]."""
    opener: Any = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as lines:
        rows = [json.loads(line)["input_ids"] for line in lines]
    return np.asarray(rows, np.int32)


class GPT2(nx.Experiment):
    """A decoder-only transformer trained on next-token prediction.

    Batches are `{"tokens": int32[batch, seq + 1]}`: the model reads the first seq
    tokens of each window and predicts the last seq.
    """

    vocab: nx.GraphConst[int] = 50304
    """The vocabulary: the embedding's rows and the head's outputs."""
    layers: nx.GraphConst[int] = 12
    """Transformer blocks."""
    width: nx.GraphConst[int] = 768
    """The model width."""
    heads: nx.GraphConst[int] = 12
    """Attention heads (each of width // heads)."""
    seq: nx.GraphConst[int] = 1024
    """The context: positions a window trains on."""
    remat: nx.GraphConst[str] = "none"
    """What the backward pass keeps of each block: "none" (everything), "blocks"
    (only its input: the rest is recomputed) or "dots" (its linear layers' outputs
    too); see `nn_modules.REMAT_POLICIES`."""
    attention: nx.GraphConst[str] = "auto"
    """How the blocks compute their causal attention: "auto" ("flash" on a TPU,
    "xla" elsewhere, chosen when the program is compiled), "xla" (written out in
    JAX, on any backend), "flash" (the Pallas TPU flash attention kernel, on a TPU
    only) or "cudnn" (cuDNN's fused attention, on an NVIDIA GPU in bf16); see
    `nn_modules.ATTENTIONS`."""
    loss_chunks: nx.GraphConst[int] = 0
    """How many chunks of positions the training loss computes the head's logits
    in, one at a time (`nn_xent.token_cross_entropy`): 0 (all at once, the logits
    [batch, seq, vocab]) or a divisor of `seq`. Training only: evaluation,
    prediction and export see the logits."""
    batch: int = 16
    """Windows a step (read only when `train` is None)."""
    lr: float = 6e-4
    """AdamW's learning rate."""
    data: str = DATA["gpt2-small"]
    """The JSONL file of windows, read when `train` is None."""
    train: Any = None
    """The train split, or None for the windows of `data` in batches of `batch`
    (an `ArraySource`, shuffled each epoch from the run seed)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        name = type(self).__name__
        try:
            check_remat(self.remat, f"{name}.remat", 'remat="dots"')
            check_attention(self.attention, f"{name}.attention", 'attention="xla"')
            check_loss_chunks(
                self.loss_chunks, self.seq, f"{name}.loss_chunks", "loss_chunks={}"
            )
        except ValueError as error:
            raise nx.ConfigError(str(error)) from None

    def build_data(self, dist: Any) -> dict[str, Any]:
        del dist
        if self.train is not None:
            return {"train": self.train}
        windows = read_windows(self.data)
        return {"train": nx.ArraySource({"tokens": windows}, self.batch)}

    def build_model(self, rng: Any) -> tuple[Any, Any, Any]:
        # The backend is asked here, not in __post_init__: the run's processes
        # have joined by now, and asking starts the backend.
        try:
            check_attention_backend(
                self.attention,
                f"{type(self).__name__}.attention",
                'attention="xla"',
            )
        except ValueError as error:
            raise nx.ConfigError(str(error)) from None
        module = GPT(
            self.vocab,
            self.layers,
            self.width,
            self.heads,
            self.seq,
            remat=self.remat,
            attention=self.attention,
            loss_chunks=self.loss_chunks,
            rngs=nnx.Rngs(params=rng),
        )
        graphdef, params = nnx.split(module)
        return graphdef, params, {}

    def forward(self, model: Any, params: Any, state: Any, *, tokens: Any) -> Any:
        module, inputs = nnx.merge(model, params), tokens[:, :-1]
        # In training with loss_chunks, `nn_xent.ChunkedLogits` in their place.
        logits = module.loss_logits(inputs) if nx.training() else module(inputs)
        return (logits, tokens[:, 1:]), state

    def loss(self, outputs: Any) -> Any:
        logits, targets = outputs
        return token_cross_entropy(logits, targets).mean()

    def optimizer(self) -> Any:
        return functools.partial(
            optax.adam, b1=ADAMW["b1"], b2=ADAMW["b2"], eps=ADAMW["eps"]
        )

    def learning_rate(self, group: str | None = None) -> float:
        return self.lr

    def weight_decay(self, group: str | None = None) -> float:
        return ADAMW["weight_decay"]


def experiment(config: str, **fields: Any) -> GPT2:
    """The experiment of a configuration in CONFIGS, reading its data file."""
    sizes = dict(CONFIGS[config])
    batch = sizes.pop("batch")
    return GPT2(**{**sizes, "batch": batch, "data": DATA[config], **fields})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=sorted(CONFIGS), default="tiny")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--precision", choices=("bf16", "f32"), default="bf16")
    parser.add_argument("--remat", choices=("none", "blocks", "dots"), default="none")
    parser.add_argument("--attention", choices=("xla", "flash", "cudnn"), default="xla")
    parser.add_argument("--loss-chunks", type=int, default=0, metavar="N")
    args = parser.parse_args()
    if not os.path.exists(DATA[args.config]):
        raise SystemExit(
            f"{DATA[args.config]} is missing: write it with "
            f"`python examples/runfiles/make_data.py --gpt2`"
        )
    fields: dict[str, Any] = {
        "remat": args.remat,
        "attention": args.attention,
        "loss_chunks": args.loss_chunks,
    }
    if args.batch is not None:
        fields["batch"] = args.batch
    nitro = nx.Nitro(
        experiment(args.config, **fields),
        max_steps=args.steps,
        max_epochs=args.steps,
        precision=args.precision,
        run_dir=os.environ.get("NITRO_RUN_DIR", "runs/gpt2"),
    )
    nitro.train()
    print(
        f"{nitro.current_step} steps, train loss {nitro.history[-1]['train_loss']:.4f}"
    )
    nitro.cost_report()


if __name__ == "__main__":
    main()
