"""The Flax NNX modules behind the "sexpgpu/nn" models.

Each class is built from NNX layers (`nnx.Linear`, `nnx.Embed`, `nnx.LayerNorm`,
`nnx.RMSNorm`); its attribute names are chosen so that the run file's parameter
names follow from the NNX state paths by one rule (`nn_models.parameter_name`):
`attn_norm` is `attn-norm`, an `nnx.Linear`'s `kernel` is `weight`, and an
`nnx.Embed`'s table takes the name of the attribute holding it
(`embed.token.embedding` is `embed.token`).

This module imports Flax at import time; `nn_models` imports it only when a model
is built, so the rest of the run file works without the `flax` extra.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from .nn_attention import AUTO_ATTENTION
from .nn_cudnn import cudnn_causal_attention
from .nn_flash import flash_causal_attention
from .nn_xent import ChunkedLogits, check_chunked_time, check_loss_chunks

ACTIVATIONS: dict[str, Callable[[Any], Any]] = {
    "gelu": jax.nn.gelu,
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "tanh": jnp.tanh,
}
"""The activations `mlp :activation` names."""

GPT_STD = 0.02
"""The standard deviation of `gpt`'s weights and embeddings (GPT-2's)."""

REMAT_POLICIES: dict[str, Callable[..., bool] | None] = {
    "none": None,
    "blocks": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}
"""`GPT`'s rematerialisation policies: what the backward pass keeps of each block's
forward pass. "none" keeps everything (the block is not rematerialised: the
program is the plain one); "blocks" keeps only each block's input and recomputes
the rest of the block in the backward pass; "dots" keeps the outputs of the
matrix products without batch dimensions (the linear layers') and recomputes the
rest (the norms, the attention scores and weights, the GELU), JAX's heuristic for
transformers (`jax.checkpoint_policies.dots_with_no_batch_dims_saveable`). The
value of "none" is never passed to `nnx.remat` (whose own `policy=None` would save
nothing)."""

UNKNOWN_CHOICE = (
    "{owner} must be one of {choices}, got {value!r}: it names {what} ({meaning}). "
    "Pass one of them, e.g. {example}."
)
"""The message of an unknown name among a GPT option's choices; `owner` names the
field or argument."""


def _check_choice(
    value: object,
    choices: Iterable[str],
    owner: str,
    what: str,
    meaning: str,
    example: str,
) -> str:
    """`value` if it is one of `choices`; else ValueError(UNKNOWN_CHOICE)."""
    names = tuple(choices)
    if isinstance(value, str) and value in names:
        return value
    raise ValueError(
        UNKNOWN_CHOICE.format(
            owner=owner,
            choices=", ".join(repr(name) for name in names),
            value=value,
            what=what,
            meaning=meaning,
            example=example,
        )
    )


def check_remat(value: object, owner: str, example: str) -> str:
    """`value` if it names a policy in REMAT_POLICIES.

    Raises:
        ValueError: any other value, naming `owner`, the value and the choices.
    """
    return _check_choice(
        value,
        REMAT_POLICIES,
        owner,
        "what the backward pass keeps of each block",
        '"none": everything, "blocks": only its input, "dots": the outputs of its '
        "linear layers",
        example,
    )


ATTENTIONS: dict[str, str] = {
    "auto": "the attention chosen for the backend the program is compiled for: "
    '"flash" on a TPU (measured faster there), "xla" elsewhere',
    "xla": "the attention written out in JAX (two einsums, a causal mask and a "
    "softmax), which XLA compiles on any backend",
    "flash": "the Pallas TPU flash attention kernel for sparse masks (`nn_flash`), "
    "which never holds the [time, time] scores in memory and skips the blocks "
    "above the causal diagonal; it compiles for a TPU only",
    "cudnn": "cuDNN's fused attention (`nn_cudnn`), which never holds the "
    "[time, time] scores in memory either; on an NVIDIA GPU only, in bfloat16 or "
    "float16",
}
"""How `GPT`'s blocks compute their causal attention. The parameters, the function
and (up to rounding) the values are the same; only the program differs."""


def written_out_attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """Causal softmax attention of q, k, v [batch, time, heads, head_dim] written
    out in JAX ("xla"): the scores [batch, heads, time, time], the causal mask, a
    softmax and the weighted sum."""
    # Written out rather than jax.nn.dot_product_attention, whose XLA form (the
    # one it picks by default) moves about 2% more bytes on the minimal model.
    time, head_dim = q.shape[1], q.shape[3]
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / head_dim**0.5
    causal = jnp.tril(jnp.ones((time, time), bool))[None, None]
    weights = jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", weights, v)


def automatic_attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """The attention "auto" names: each platform's of
    `nn_attention.AUTO_ATTENTION`, chosen when the program is lowered for its
    platform (`jax.lax.platform_dependent`), so neither building nor tracing the
    module asks for the backend. Every branch is traced; XLA keeps only the chosen
    one, and the residuals the others would have saved for the backward pass are
    dead code it removes (measured on a CPU: the temporary memory of the chosen
    branch alone, 0 bytes where the other's would have been 100 MB)."""
    chosen = {platform: FUSED[name] for platform, name in AUTO_ATTENTION.items()}
    return jax.lax.platform_dependent(q, k, v, default=written_out_attention, **chosen)


FUSED = {"flash": flash_causal_attention, "cudnn": cudnn_causal_attention}
"""The attentions computed by a kernel of their own, [batch, time, heads, head_dim]
in and out."""

ATTENTION_FUNCTIONS: dict[str, Callable[[Any, Any, Any], Any]] = {
    "auto": automatic_attention,
    "xla": written_out_attention,
    **FUSED,
}
"""Each of ATTENTIONS as a function of q, k, v [batch, time, heads, head_dim]."""


def check_attention(value: object, owner: str, example: str) -> str:
    """`value` if it names an attention in ATTENTIONS (whatever the backend:
    `nn_attention.check_attention_backend` asks that when the parameters are built).

    Raises:
        ValueError: any other value, naming `owner`, the value and the choices.
    """
    return _check_choice(
        value,
        ATTENTIONS,
        owner,
        "how each block computes its causal attention",
        '"auto": "flash" on a TPU, "xla" elsewhere; "xla": written out in JAX, on '
        'any backend; "flash": the Pallas TPU flash attention kernel, on a TPU '
        'only; "cudnn": cuDNN\'s fused attention, on an NVIDIA GPU only',
        example,
    )


class Embeddings(nnx.Module):
    """`gpt`'s learned token and position embeddings: `token` [vocab, dim] and
    `position` [context, dim]."""

    def __init__(self, vocab: int, context: int, dim: int, *, rngs: nnx.Rngs):
        init = nnx.initializers.normal(GPT_STD)
        self.token = nnx.Embed(vocab, dim, embedding_init=init, rngs=rngs)
        self.position = nnx.Embed(context, dim, embedding_init=init, rngs=rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        """[batch, time] integer tokens -> [batch, time, dim] embeddings."""
        # The tables are read directly: `nnx.Embed.__call__` casts to its `dtype`
        # (float32 unless given), which would undo a bf16 run's compute dtype.
        time = tokens.shape[1]
        return self.token.embedding[...][tokens] + self.position.embedding[:time][None]


class Attention(nnx.Module):
    """Causal multi-head self-attention: `query`, `key`, `value` and `out`, each an
    `nnx.Linear` [dim, dim] with a bias; `attention` (a name in ATTENTIONS) says
    how the heads are mixed."""

    def __init__(
        self,
        dim: int,
        heads: int,
        residual_std: float,
        *,
        attention: str = "auto",
        rngs: nnx.Rngs,
    ):
        init = nnx.initializers.normal(GPT_STD)
        self.heads = heads
        self.attention = attention
        self.query = nnx.Linear(dim, dim, kernel_init=init, rngs=rngs)
        self.key = nnx.Linear(dim, dim, kernel_init=init, rngs=rngs)
        self.value = nnx.Linear(dim, dim, kernel_init=init, rngs=rngs)
        self.out = nnx.Linear(
            dim, dim, kernel_init=nnx.initializers.normal(residual_std), rngs=rngs
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        """[batch, time, dim] -> [batch, time, dim]; a position sees itself and the
        positions before it."""
        batch, time, dim = x.shape
        head_dim = dim // self.heads
        split = (batch, time, self.heads, head_dim)
        # Named for profiles: a trace tells this block's ops apart by it.
        with jax.named_scope("attention"):
            q, k, v = (f(x).reshape(split) for f in (self.query, self.key, self.value))
            mix = ATTENTION_FUNCTIONS[self.attention]
            return self.out(mix(q, k, v).reshape(batch, time, dim))


class FeedForward(nnx.Module):
    """`gpt`'s MLP: `up` [dim, 4 dim], GELU, `down` [4 dim, dim], with biases."""

    def __init__(self, dim: int, residual_std: float, *, rngs: nnx.Rngs):
        init = nnx.initializers.normal(GPT_STD)
        self.up = nnx.Linear(dim, 4 * dim, kernel_init=init, rngs=rngs)
        self.down = nnx.Linear(
            4 * dim, dim, kernel_init=nnx.initializers.normal(residual_std), rngs=rngs
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        """[..., dim] -> [..., dim]."""
        with jax.named_scope("mlp"):  # named for profiles, as "attention"
            return self.down(jax.nn.gelu(self.up(x)))


class Block(nnx.Module):
    """A pre-norm transformer block: `x + attn(attn_norm(x))`, then
    `x + mlp(mlp_norm(x))`; the norms are RMS norms with a scale."""

    def __init__(
        self,
        dim: int,
        heads: int,
        residual_std: float,
        *,
        attention: str = "auto",
        rngs: nnx.Rngs,
    ):
        self.attn_norm = nnx.RMSNorm(dim, epsilon=1e-6, rngs=rngs)
        self.attn = Attention(dim, heads, residual_std, attention=attention, rngs=rngs)
        self.mlp_norm = nnx.RMSNorm(dim, epsilon=1e-6, rngs=rngs)
        self.mlp = FeedForward(dim, residual_std, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        """[batch, time, dim] -> [batch, time, dim]."""
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class GPT(nnx.Module):
    """A decoder-only transformer: `embed`, `blocks`, a final RMS `norm` and an
    untied `head` [dim, vocab] without a bias. Weights and embeddings start
    normal(0.02), the residual projections (`attn.out`, `mlp.down`) normal(0.02 /
    sqrt(2 layers)); biases start at 0 and norm scales at 1.

    `remat` (a name in REMAT_POLICIES) rematerialises each block under that
    policy (`nnx.remat`): the gradient is the same, the backward pass keeps less
    and recomputes the rest. It changes no parameter, only the traced program.

    `attention` (a name in ATTENTIONS) says how each block computes its causal
    attention: "auto" (the default) compiles to "flash" on a TPU and to "xla"
    elsewhere, chosen when the program is lowered; "xla" writes it out in JAX;
    "flash" calls the Pallas TPU flash attention kernel (`nn_flash`), "cudnn"
    cuDNN's fused attention (`nn_cudnn`). The parameters are the same, the loss
    and the gradient equal up to rounding. Each kernel compiles on one backend (a
    TPU; an NVIDIA GPU), and constructing the module does not ask for the backend
    (a run file builds it before its processes join): when naming a kernel, call
    `nn_attention.check_attention_backend` before compiling, as the fronts do when
    they build the parameters, or the compile fails in the kernel's lowering.

    `loss_chunks` (0, the default, or a divisor of `context`) says how the
    training loss reads the head: `loss_logits` gives the logits when it is 0, and
    otherwise `nn_xent.ChunkedLogits` (the head's input and weight), which
    `nn_xent.token_cross_entropy` turns into the loss `loss_chunks` chunks of
    positions at a time, never holding the whole [batch, time, vocab] logits. Only
    what training computes differs (the loss and the gradient are equal up to
    rounding): `__call__`, which evaluation, prediction and export call, always
    gives the logits.

        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> model = GPT(32, 2, 16, 2, 8, remat="blocks", rngs=nnx.Rngs(0))
        >>> model(jnp.zeros((1, 8), jnp.int32)).shape
        (1, 8, 32)
        >>> chunked = GPT(32, 2, 16, 2, 8, loss_chunks=4, rngs=nnx.Rngs(0))
        >>> chunked.loss_logits(jnp.zeros((1, 8), jnp.int32)).logits_shape
        (1, 8, 32)
    """

    def __init__(
        self,
        vocab: int,
        layers: int,
        dim: int,
        heads: int,
        context: int,
        *,
        remat: str = "none",
        attention: str = "auto",
        loss_chunks: int = 0,
        rngs: nnx.Rngs,
    ):
        self.remat = check_remat(remat, "GPT(remat=...)", 'remat="dots"')
        self.attention = check_attention(
            attention, "GPT(attention=...)", 'attention="xla"'
        )
        self.loss_chunks = check_loss_chunks(
            loss_chunks, context, "GPT(loss_chunks=...)", "loss_chunks={}"
        )
        residual_std = GPT_STD / (2 * layers) ** 0.5
        self.embed = Embeddings(vocab, context, dim, rngs=rngs)
        self.blocks = nnx.List(
            [
                Block(dim, heads, residual_std, attention=attention, rngs=rngs)
                for _ in range(layers)
            ]
        )
        self.norm = nnx.RMSNorm(dim, epsilon=1e-6, rngs=rngs)
        self.head = nnx.Linear(
            dim,
            vocab,
            use_bias=False,
            kernel_init=nnx.initializers.normal(GPT_STD),
            rngs=rngs,
        )

    def __call__(self, tokens: jax.Array) -> jax.Array:
        """[batch, time] integer tokens -> [batch, time, vocab] logits."""
        hidden = self.features(tokens)
        with jax.named_scope("head"):  # named for profiles, as "attention"
            return self.head(hidden)

    def loss_logits(self, tokens: jax.Array) -> jax.Array | ChunkedLogits:
        """What the training loss reads of [batch, time] integer tokens: the
        logits [batch, time, vocab] when `loss_chunks` is 0, else `ChunkedLogits`
        of the features and the head's weight (`nn_xent.token_cross_entropy`
        takes either).

        Raises:
            ValueError: `loss_chunks` does not divide `time` (UNEVEN_CHUNKS).
        """
        if not self.loss_chunks:
            return self(tokens)
        check_chunked_time(
            tokens.shape[1], self.loss_chunks, "GPT.loss_chunks", "loss_chunks={}"
        )
        hidden = self.features(tokens)
        kernel = self.head.kernel[...]
        compute = jnp.result_type(hidden, kernel).name
        return ChunkedLogits(hidden, kernel, self.loss_chunks, compute)

    def features(self, tokens: jax.Array) -> jax.Array:
        """[batch, time] integer tokens -> [batch, time, dim]: the final norm's
        output, the head's input."""
        x = self.embed(tokens)
        call = _call_block
        if self.remat != "none":
            # prevent_cse stays on (nnx.remat's default): the blocks are unrolled,
            # not scanned, and XLA would otherwise merge the recomputation back
            # into the forward pass.
            call = nnx.remat(_call_block, policy=REMAT_POLICIES[self.remat])
        for block in self.blocks:
            x = call(block, x)
        return self.norm(x)


def _call_block(block: Block, x: jax.Array) -> jax.Array:
    return block(x)


class Embedding(nnx.Module):
    """The `embedding` layer: its table `weight` [vocab, dim] is an `nnx.Embed`
    (NNX's default initialisation)."""

    def __init__(self, vocab: int, dim: int, *, rngs: nnx.Rngs):
        self.weight = nnx.Embed(vocab, dim, rngs=rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        """[...] integer tokens -> [..., dim] (in the table's dtype, see
        `Embeddings`)."""
        return self.weight.embedding[...][tokens]


class MLP(nnx.Module):
    """The `mlp` layer: `nnx.Linear` layers numbered from 0 between consecutive
    sizes of `dims`, the activation between them (none after the last)."""

    def __init__(
        self, dims: Sequence[int], activation: str, bias: bool, *, rngs: nnx.Rngs
    ):
        self.activation = activation
        self.layers = nnx.List(
            [
                nnx.Linear(a, b, use_bias=bias, rngs=rngs)
                for a, b in zip(dims[:-1], dims[1:], strict=True)
            ]
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        """[..., dims[0]] -> [..., dims[-1]]."""
        act = ACTIVATIONS[self.activation]
        for i, layer in enumerate(self.layers):
            x = layer(x) if i == len(self.layers) - 1 else act(layer(x))
        return x


class Sequential(nnx.Module):
    """`sequential`: its `layers` applied in order (numbered from 0)."""

    def __init__(self, layers: Sequence[nnx.Module]):
        self.layers = nnx.List(list(layers))

    def __call__(self, x: jax.Array) -> jax.Array:
        """The last layer's output of `x` passed through every layer."""
        for layer in self.layers:
            x = layer(x)
        return x
