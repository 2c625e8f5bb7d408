"""The standard module "sexpgpu/nn": `gpt` and `cross-entropy`.

`gpt` declares the model: its parameters' names and shapes, their initial
values, and a forward pass in plain JAX. `check` traces the forward pass with
`jax.eval_shape`; `run` trains it on the engine, with the parameters as a tree
nested by the dotted names (`model.blocks.0.attn.query.weight` is
`params["model"]["blocks"]["0"]["attn"]["query"]["weight"]`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .core import expect
from .source import Span, fail
from .values import Builtin, Keyword, kind_of


@dataclass(frozen=True)
class GPTSpec:
    """A decoder-only transformer: learned token and position embeddings, pre-norm
    blocks (RMS norm with a scale, attention and an MLP whose linear layers carry
    biases) and an untied head. `4 + 14 * layers` parameter arrays."""

    vocab: int
    layers: int
    dim: int
    heads: int
    context: int
    kind = "a model"

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every parameter's name (as groups select it) and shape."""
        d, hidden = self.dim, 4 * self.dim
        shapes: dict[str, tuple[int, ...]] = {
            "model.embed.token": (self.vocab, d),
            "model.embed.position": (self.context, d),
        }
        for i in range(self.layers):
            block = f"model.blocks.{i}"
            shapes[f"{block}.attn-norm.scale"] = (d,)
            for part in ("query", "key", "value", "out"):
                shapes[f"{block}.attn.{part}.weight"] = (d, d)
                shapes[f"{block}.attn.{part}.bias"] = (d,)
            shapes[f"{block}.mlp-norm.scale"] = (d,)
            shapes[f"{block}.mlp.up.weight"] = (d, hidden)
            shapes[f"{block}.mlp.up.bias"] = (hidden,)
            shapes[f"{block}.mlp.down.weight"] = (hidden, d)
            shapes[f"{block}.mlp.down.bias"] = (d,)
        shapes["model.norm.scale"] = (d,)
        shapes["model.head.weight"] = (d, self.vocab)
        return shapes

    def init(self, rng: Any) -> dict[str, Any]:
        """Initial parameters by name: weights and embeddings normal with standard
        deviation 0.02 (the residual projections scaled by `1/sqrt(2 * layers)`),
        biases zero, norm scales one. `rng` is a JAX key."""
        import jax
        import jax.numpy as jnp

        shapes = self.parameter_shapes()
        keys = jax.random.split(rng, len(shapes))
        residual = 0.02 / (2 * self.layers) ** 0.5
        params: dict[str, Any] = {}
        for key, (name, shape) in zip(keys, shapes.items(), strict=True):
            if name.endswith(".bias"):
                params[name] = jnp.zeros(shape, jnp.float32)
            elif name.endswith(".scale"):
                params[name] = jnp.ones(shape, jnp.float32)
            else:
                std = residual if name.endswith(("out.weight", "down.weight")) else 0.02
                params[name] = std * jax.random.normal(key, shape, jnp.float32)
        return params

    def apply(self, params: dict[str, Any], tokens: Any, span: Span) -> Any:
        """Logits `[batch, time, vocab]` of integer tokens `[batch, time]`."""
        import jax
        import jax.numpy as jnp

        if len(tokens.shape) != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
            raise fail(
                "E-SHAPE-002",
                f"`gpt` takes integer tokens [batch, time], got {kind_of(tokens)}",
                span,
                "pass (slice tokens 1 0 n) of an :i32 field as :inputs",
            )
        batch, time = tokens.shape
        if time > self.context:
            raise fail(
                "E-SHAPE-003",
                f"`gpt` sees {time} positions but its :context is {self.context}",
                span,
                f"pass :context {time} or more",
            )
        p = params

        def norm(x: Any, name: str) -> Any:
            scale = p[name][None, None, :]
            return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * scale

        def linear(x: Any, name: str) -> Any:
            return x @ p[f"{name}.weight"] + p[f"{name}.bias"][None, None, :]

        x = p["model.embed.token"][tokens] + p["model.embed.position"][None, :time]
        head_dim = self.dim // self.heads
        mask = jnp.tril(jnp.ones((time, time), bool))[None, None]
        for i in range(self.layers):
            b = f"model.blocks.{i}"
            h = norm(x, f"{b}.attn-norm.scale")
            q, k, v = (
                linear(h, f"{b}.attn.{n}").reshape(batch, time, self.heads, head_dim)
                for n in ("query", "key", "value")
            )
            scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / head_dim**0.5
            weights = jax.nn.softmax(jnp.where(mask, scores, -jnp.inf), axis=-1)
            mixed = jnp.einsum("bhqk,bkhd->bqhd", weights, v)
            x = x + linear(mixed.reshape(batch, time, self.dim), f"{b}.attn.out")
            h = jax.nn.gelu(linear(norm(x, f"{b}.mlp-norm.scale"), f"{b}.mlp.up"))
            x = x + linear(h, f"{b}.mlp.down")
        return norm(x, "model.norm.scale") @ p["model.head.weight"]


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


def _int(kwargs: dict[str, Any], key: str, span: Span) -> int:
    value = expect(kwargs[key], int, f"`:{key}` of `gpt`", span, "a positive integer")
    if value < 1:
        raise fail(
            "E-EVAL-007", f"`:{key}` of `gpt` must be positive, got {value}", span
        )
    return int(value)


def _gpt(values: list[Any], kwargs: dict[str, Any], span: Span) -> GPTSpec:
    kwargs = {"context": 1024, **kwargs}
    spec = GPTSpec(
        *(_int(kwargs, k, span) for k in ("vocab", "layers", "dim", "heads", "context"))
    )
    if spec.dim % spec.heads:
        raise fail(
            "E-SHAPE-001",
            f"`gpt` :dim {spec.dim} is not divisible by :heads {spec.heads}",
            span,
            "pick :heads dividing :dim",
        )
    return spec


def _cross_entropy(values: list[Any], kwargs: dict[str, Any], span: Span) -> Any:
    import jax.numpy as jnp
    import optax

    logits, targets = values
    if not hasattr(logits, "shape") or not hasattr(targets, "shape"):
        raise fail(
            "E-EVAL-007",
            f"`cross-entropy` takes arrays, got "
            f"{kind_of(logits)} and {kind_of(targets)}",
            span,
        )
    if tuple(logits.shape[:-1]) != tuple(targets.shape) or not jnp.issubdtype(
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
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
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
            ("vocab", "layers", "dim", "heads", "context"),
            ("vocab", "layers", "dim", "heads"),
            "(gpt :vocab 32 :layers 2 :dim 32 :heads 2)",
        ),
        "cross-entropy": Builtin(
            "cross-entropy",
            _cross_entropy,
            (2, 2),
            ("reduce",),
            doc="(cross-entropy prediction targets :reduce :sum)",
        ),
    }
