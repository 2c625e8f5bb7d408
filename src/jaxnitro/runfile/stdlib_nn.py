"""The standard module "sexpgpu/nn": the models, the layers and `cross-entropy`.

Every model value is a `ModelSpec` (`nn_models`): a frozen declaration of a Flax
NNX module with named parameters, an init from the run seed and a forward pass.
`gpt` is a whole transformer; `embedding`, `linear`, `mlp` and `layer-norm` are
layers, each a model on its own, and `sequential` chains them into one:

    (defvar model (sequential (embedding :vocab 32 :dim 16)
                              (mlp :dims [16 64 16])
                              (layer-norm :dim 16)
                              (linear :in 16 :out 32)))

declares `model.0.weight`, `model.1.0.weight`, `model.1.0.bias`, ...,
`model.3.bias`. The engine holds the parameters as a tree nested by the dotted
names (`model.blocks.0.attn.query.weight` is
`params["model"]["blocks"]["0"]["attn"]["query"]["weight"]`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .bounds import MODEL_BOUNDS, VOCAB_MAX, model_size
from .core import expect
from .nn_layers import (
    EmbeddingSpec,
    LayerNormSpec,
    LinearSpec,
    MLPSpec,
    SequentialSpec,
    is_tokens,
)
from .nn_models import ModelSpec, require_flax
from .source import Span, fail
from .values import Builtin, Keyword, kind_of, show

ACTIVATIONS = ("gelu", "relu", "silu", "tanh")
"""What `mlp :activation` takes (`nn_modules.ACTIVATIONS` holds the functions)."""

REMAT = ("none", "blocks", "dots")
"""What `gpt :remat` takes (`nn_modules.REMAT_POLICIES` holds the policies)."""

ATTENTION = ("auto", "xla", "flash", "cudnn")
"""What `gpt :attention` takes (`nn_modules.ATTENTIONS` describes them)."""

LOSS_CHUNKS_UNEVEN = (
    "`gpt` with :loss-chunks {chunks} cuts the {time} positions of a training batch "
    "into {chunks} chunks, which {chunks} does not divide"
)
"""E-SHAPE-013's message when a training batch's positions are not a multiple of
`:loss-chunks` (the run file's form of `nn_xent.UNEVEN_CHUNKS`)."""

OFF_BACKEND = {
    "flash": (
        "`:attention :flash` of `gpt` is the Pallas TPU flash attention kernel, which "
        "compiles for a TPU only, and this run's JAX backend is {backend}",
        "run on a TPU",
    ),
    "cudnn": (
        "`:attention :cudnn` of `gpt` is cuDNN's fused attention, which runs on an "
        "NVIDIA GPU only, and this run's JAX backend is {backend}",
        "run on an NVIDIA GPU",
    ),
}
"""E-RUN-012's message and the end of its fix, per attention: the run file's form
of `nn_flash.FLASH_OFF_TPU` and `nn_cudnn.CUDNN_OFF_GPU`."""


@dataclass(frozen=True)
class GPTSpec(ModelSpec):
    """A decoder-only transformer (`nn_modules.GPT`): learned token and position
    embeddings, pre-norm blocks (RMS norm with a scale, causal attention and an
    MLP whose linear layers carry biases) and an untied head. `4 + 14 * layers`
    parameter arrays. `remat` (one of REMAT) rematerialises each block in the
    backward pass; `attention` (one of ATTENTION) picks how the blocks compute
    their attention; `loss_chunks` (0, or a divisor of `context`) makes the
    training prediction `nn_xent.ChunkedLogits`, which `cross-entropy` computes
    that many chunks of positions at a time (evaluation still sees the logits);
    each changes the program, never the parameters."""

    vocab: int
    layers: int
    dim: int
    heads: int
    context: int
    remat: str = "none"
    attention: str = "auto"
    loss_chunks: int = 0
    name = "gpt"

    def probe(self) -> ModelSpec:
        return dataclasses.replace(self, layers=1)

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        """The names and shapes of a one-block `gpt`, its block's repeated for
        each of `layers` (the blocks are alike): no NNX structure of the whole
        model is built, so this takes the same time at any depth."""
        one = list(ModelSpec.parameter_shapes(self.probe()).items())
        block = "model.blocks.0."
        first = next(i for i, (n, _) in enumerate(one) if n.startswith(block))
        last = max(i for i, (n, _) in enumerate(one) if n.startswith(block))
        found = dict(one[:first])
        for index in range(self.layers):
            for name, shape in one[first : last + 1]:
                found[f"model.blocks.{index}.{name[len(block) :]}"] = shape
        found.update(one[last + 1 :])
        return found

    def build(self, rngs: Any) -> Any:
        from .nn_modules import GPT

        return GPT(
            self.vocab,
            self.layers,
            self.dim,
            self.heads,
            self.context,
            remat=self.remat,
            attention=self.attention,
            loss_chunks=self.loss_chunks,
            rngs=rngs,
        )

    def check_backend(self, span: Span | None) -> None:
        """Refuse `:attention :flash` off a TPU and `:attention :cudnn` off a GPU
        (E-RUN-012), pointing at `span`.

        Raises:
            RunfileError: E-RUN-012.
        """
        from .nn_attention import attention_unavailable

        backend = attention_unavailable(self.attention)
        if backend is not None:
            message, elsewhere = OFF_BACKEND[self.attention]
            raise fail(
                "E-RUN-012",
                message.format(backend=backend),
                span,
                "write :attention :xla (the same attention written out in JAX, "
                f"which XLA compiles on any backend), or {elsewhere}",
            )

    def takes(self) -> int | None:
        return None

    def gives(self) -> int:
        return self.vocab

    def forward(self, module: Any, inputs: Any, span: Any, where: str = "") -> Any:
        """Logits `[batch, time, vocab]` of integer tokens `[batch, time]`; in
        training (`jaxnitro.training()`) with `loss_chunks`, `nn_xent.ChunkedLogits`
        standing for them (E-SHAPE-013 when the chunks do not divide `time`)."""
        if not is_tokens(inputs) or len(inputs.shape) != 2:
            raise fail(
                "E-SHAPE-002",
                f"`gpt`{where} takes integer tokens [batch, time], "
                f"got {kind_of(inputs)}",
                span,
                "pass (slice tokens 1 0 n) of an :i32 field as :inputs",
            )
        time = inputs.shape[1]
        if time > self.context:
            raise fail(
                "E-SHAPE-003",
                f"`gpt`{where} sees {time} positions but its :context is "
                f"{self.context}",
                span,
                f"pass :context {time} or more",
            )
        if self.loss_chunks and _training():
            from .nn_xent import divisor_near

            if time % self.loss_chunks:
                raise fail(
                    "E-SHAPE-013",
                    LOSS_CHUNKS_UNEVEN.format(chunks=self.loss_chunks, time=time),
                    span,
                    "train on windows of a length :loss-chunks divides (the whole "
                    f":context {self.context} is one), or write :loss-chunks "
                    f"{divisor_near(self.loss_chunks, time)}",
                )
            return module.loss_logits(inputs)
        return module(inputs)


def _training() -> bool:
    """The trace-time mode (`jaxnitro.training()`): the engine traces its train
    program, `check` and the graph key the objective, in train mode."""
    from ..experiment.modes import training

    return training()


def _positive(kwargs: dict[str, Any], key: str, builtin: str, span: Span) -> int:
    """A positive size argument within its bound (`bounds.MODEL_BOUNDS`; a layer's
    :dim, `VOCAB_MAX`)."""
    what = f"`:{key}` of `{builtin}`"
    value = expect(kwargs[key], int, what, span.at(key), "a positive integer")
    if value < 1:
        raise fail(
            "E-EVAL-007",
            f"{what} must be positive, got {value}",
            span.at(key),
            f"write :{key} 1 or more",
        )
    bound = MODEL_BOUNDS[key]
    if key == "dim" and builtin == "layer-norm":
        bound = VOCAB_MAX
    return model_size(int(value), what, bound, span.at(key))


def _flag(kwargs: dict[str, Any], key: str, builtin: str, span: Span) -> bool:
    value = kwargs.get(key, True)
    return bool(
        expect(value, bool, f"`:{key}` of `{builtin}`", span.at(key), "true or false")
    )


def _gpt(values: list[Any], kwargs: dict[str, Any], span: Span) -> GPTSpec:
    require_flax("gpt", span)
    kwargs = {"context": 1024, **kwargs}
    vocab, layers, dim, heads, context = (
        _positive(kwargs, k, "gpt", span)
        for k in ("vocab", "layers", "dim", "heads", "context")
    )
    remat = _keyword_choice(
        kwargs,
        "remat",
        REMAT,
        "what the backward pass keeps of each block",
        "write :remat :blocks to keep only each block's input, :dots to keep "
        "its linear layers' outputs too, or leave it out (:none)",
        span,
    )
    attention = _keyword_choice(
        kwargs,
        "attention",
        ATTENTION,
        "how each block computes its causal attention",
        "write :attention :xla for the attention written out in JAX (any "
        "backend), :flash for the Pallas TPU flash attention kernel (a TPU only), "
        ":cudnn for cuDNN's fused attention (an NVIDIA GPU only), or leave it out "
        "(:auto, :flash on a TPU and :xla elsewhere)",
        span,
    )
    spec = GPTSpec(
        vocab,
        layers,
        dim,
        heads,
        context,
        remat=remat,
        attention=attention,
        loss_chunks=_loss_chunks(kwargs, context, span),
    )
    if spec.dim % spec.heads:
        raise fail(
            "E-SHAPE-001",
            f"`gpt` :dim {spec.dim} is not divisible by :heads {spec.heads}",
            span.at("heads"),
            "pick :heads dividing :dim",
        )
    return spec


def _loss_chunks(kwargs: dict[str, Any], context: int, span: Span) -> int:
    """`gpt`'s `:loss-chunks`: 0 (the default: the whole logits) or a divisor of
    `context`; E-EVAL-007 for a value that is no whole number of chunks,
    E-SHAPE-013 for one that does not divide `context`."""
    value = expect(
        kwargs.get("loss-chunks", 0),
        int,
        "`:loss-chunks` of `gpt`",
        span.at("loss-chunks"),
        "0 (the whole logits at once) or a positive integer",
    )
    if value < 0:
        raise fail(
            "E-EVAL-007",
            f"`:loss-chunks` of `gpt` must be 0 or positive, got {value}",
            span.at("loss-chunks"),
            "write :loss-chunks 4 to compute the training loss in 4 chunks of "
            "positions, or leave it out (0: the whole logits at once)",
        )
    if value and context % value:
        from .nn_xent import divisor_near

        raise fail(
            "E-SHAPE-013",
            f"`:loss-chunks {value}` of `gpt` does not divide its :context {context}",
            span.at("loss-chunks"),
            f"write :loss-chunks {divisor_near(value, context)} (a divisor of "
            f"{context}), or leave it out (0: the whole logits at once)",
        )
    return int(value)


def _keyword_choice(
    kwargs: dict[str, Any],
    name: str,
    choices: tuple[str, ...],
    what: str,
    hint: str,
    span: Span,
) -> str:
    """`gpt`'s `:name` keyword, one of `choices` (the first when left out);
    E-EVAL-007 naming what it chooses and the choices otherwise."""
    value = kwargs.get(name, Keyword(choices[0]))
    if not isinstance(value, Keyword) or value.name not in choices:
        raise fail(
            "E-EVAL-007",
            f"`:{name}` of `gpt` is "
            + ", ".join(f":{c}" for c in choices)
            + f" ({what}), got {show(value)}",
            span.at(name),
            hint,
        )
    return value.name


def _embedding(values: list[Any], kwargs: dict[str, Any], span: Span) -> EmbeddingSpec:
    require_flax("embedding", span)
    return EmbeddingSpec(
        _positive(kwargs, "vocab", "embedding", span),
        _positive(kwargs, "dim", "embedding", span),
    )


def _linear(values: list[Any], kwargs: dict[str, Any], span: Span) -> LinearSpec:
    require_flax("linear", span)
    return LinearSpec(
        _positive(kwargs, "in", "linear", span),
        _positive(kwargs, "out", "linear", span),
        _flag(kwargs, "bias", "linear", span),
    )


def _mlp(values: list[Any], kwargs: dict[str, Any], span: Span) -> MLPSpec:
    require_flax("mlp", span)
    dims = kwargs["dims"]
    if (
        not isinstance(dims, tuple)
        or len(dims) < 2
        or not all(isinstance(d, int) and not isinstance(d, bool) for d in dims)
        or min(dims) < 1
    ):
        raise fail(
            "E-EVAL-007",
            "`:dims` of `mlp` must be a vector of two or more positive integers "
            f"(the input size, the hidden sizes, the output size), got {show(dims)}",
            span.at("dims"),
            "write :dims [16 64 16]",
        )
    for size in dims:
        model_size(size, "a size in `:dims` of `mlp`", VOCAB_MAX, span.at("dims"))
    activation = kwargs.get("activation", Keyword("gelu"))
    if not isinstance(activation, Keyword) or activation.name not in ACTIVATIONS:
        raise fail(
            "E-EVAL-007",
            "`:activation` of `mlp` is "
            + ", ".join(f":{a}" for a in ACTIVATIONS)
            + f", got {show(activation)}",
            span.at("activation"),
            "write :activation :gelu",
        )
    return MLPSpec(dims, activation.name, _flag(kwargs, "bias", "mlp", span))


def _layer_norm(values: list[Any], kwargs: dict[str, Any], span: Span) -> LayerNormSpec:
    require_flax("layer-norm", span)
    eps = expect(
        kwargs.get("eps", 1e-5),
        (int, float),
        "`:eps` of `layer-norm`",
        span.at("eps"),
        "a number",
    )
    if eps <= 0:
        raise fail(
            "E-EVAL-007",
            f"`:eps` of `layer-norm` must be positive, got {show(eps)}",
            span.at("eps"),
            "write :eps 1e-5",
        )
    return LayerNormSpec(_positive(kwargs, "dim", "layer-norm", span), float(eps))


def _sequential(
    values: list[Any], kwargs: dict[str, Any], span: Span
) -> SequentialSpec:
    for index, layer in enumerate(values):
        if not isinstance(layer, ModelSpec):
            raise fail(
                "E-EVAL-007",
                f"layer {index} of `sequential` must be a model or a layer, "
                f"got {kind_of(layer)} {show(layer)}",
                span.at(index),
                "pass layers such as (linear :in 16 :out 32)",
            )
    for index, layer in enumerate(values[:-1]):
        if isinstance(layer, GPTSpec) and layer.loss_chunks:
            raise fail(
                "E-SHAPE-013",
                f"layer {index} of `sequential` is a `gpt` with :loss-chunks "
                f"{layer.loss_chunks}, whose training prediction only "
                "`cross-entropy` reads, and another layer follows it",
                span.at(index),
                "leave :loss-chunks out of a `gpt` that other layers follow",
            )
    for index in range(1, len(values)):
        before, layer = values[index - 1], values[index]
        wanted = layer.takes()
        if wanted is None or wanted != before.gives():
            takes = "integer tokens" if wanted is None else f"{wanted} features"
            raise fail(
                "E-SHAPE-011",
                f"layer {index} of `sequential` (`{layer.name}`) takes {takes}, "
                f"but layer {index - 1} (`{before.name}`) gives {before.gives()} "
                "features",
                span.at(index),
                "only the first layer takes tokens"
                if wanted is None
                else f"make layer {index} take {before.gives()} features",
            )
    return SequentialSpec(tuple(values))


def nest(flat: dict[str, Any]) -> dict[str, Any]:
    """A tree nested by the dotted names: {"a.b": x} -> {"a": {"b": x}}."""
    tree: dict[str, Any] = {}
    for name, value in flat.items():
        *path, leaf = name.split(".")
        node = tree
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """The inverse of `nest`: dotted names to leaves."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def _cross_entropy(values: list[Any], kwargs: dict[str, Any], span: Span) -> Any:
    import jax.numpy as jnp

    from .nn_xent import ChunkedLogits, token_cross_entropy

    logits, targets = values
    chunked = isinstance(logits, ChunkedLogits)
    if not (chunked or hasattr(logits, "shape")) or not hasattr(targets, "shape"):
        raise fail(
            "E-EVAL-007",
            f"`cross-entropy` takes arrays, got "
            f"{kind_of(logits)} and {kind_of(targets)}",
            span,
        )
    shape = logits.logits_shape if chunked else logits.shape
    if tuple(shape[:-1]) != tuple(targets.shape) or not jnp.issubdtype(
        targets.dtype, jnp.integer
    ):
        raise fail(
            "E-SHAPE-005",
            f"`cross-entropy` takes logits [..., classes] and "
            f"integer targets [...]: got {kind_of(logits)} and "
            f"{kind_of(targets)}",
            span,
            "the targets are the inputs shifted by one: (slice tokens 1 1 n)",
        )
    # `gpt :loss-chunks`'s training prediction is computed a chunk at a time.
    losses = token_cross_entropy(logits, targets)
    reduce = kwargs.get("reduce", Keyword("mean"))
    if reduce not in (Keyword("mean"), Keyword("sum"), Keyword("none")):
        raise fail(
            "E-EVAL-007",
            f"`:reduce` of `cross-entropy` is :mean, :sum or :none (per token), "
            f"got {reduce}",
            span,
        )
    if reduce == Keyword("none"):
        return losses
    return losses.sum() if reduce == Keyword("sum") else losses.mean()


def exports() -> dict[str, Builtin]:
    """The names "sexpgpu/nn" exports."""
    return {
        "gpt": Builtin(
            "gpt",
            _gpt,
            (0, 0),
            (
                "vocab",
                "layers",
                "dim",
                "heads",
                "context",
                "remat",
                "attention",
                "loss-chunks",
            ),
            ("vocab", "layers", "dim", "heads"),
            "(gpt :vocab 32 :layers 2 :dim 32 :heads 2)",
        ),
        "embedding": Builtin(
            "embedding",
            _embedding,
            (0, 0),
            ("vocab", "dim"),
            ("vocab", "dim"),
            "(embedding :vocab 32 :dim 16)",
        ),
        "linear": Builtin(
            "linear",
            _linear,
            (0, 0),
            ("in", "out", "bias"),
            ("in", "out"),
            "(linear :in 16 :out 32)",
        ),
        "mlp": Builtin(
            "mlp",
            _mlp,
            (0, 0),
            ("dims", "activation", "bias"),
            ("dims",),
            "(mlp :dims [16 64 16])",
        ),
        "layer-norm": Builtin(
            "layer-norm",
            _layer_norm,
            (0, 0),
            ("dim", "eps"),
            ("dim",),
            "(layer-norm :dim 16)",
        ),
        "sequential": Builtin(
            "sequential",
            _sequential,
            (1, None),
            (),
            doc="(sequential (embedding :vocab 32 :dim 16) (linear :in 16 :out 32))",
        ),
        "cross-entropy": Builtin(
            "cross-entropy",
            _cross_entropy,
            (2, 2),
            ("reduce",),
            doc="(cross-entropy prediction targets :reduce :sum)",
        ),
    }
