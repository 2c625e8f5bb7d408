"""The layers of "sexpgpu/nn": `embedding`, `linear`, `mlp`, `layer-norm` and
`sequential`, as model declarations (`nn_models.ModelSpec`).

Each layer is a model on its own (`(defvar model (linear :in 4 :out 2))` declares
`model.weight` and `model.bias`); `sequential` chains them, layer i's parameters
named `model.i.*`. A layer says what it takes (`takes`: a feature count, or None
for integer tokens) and what it gives, so `sequential` refuses layers that do not
chain when the file is evaluated (E-SHAPE-011), before anything is traced; its
forward pass checks what each layer receives (E-SHAPE-002, naming the layer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .nn_models import ModelSpec
from .source import fail
from .values import kind_of


def is_tokens(value: Any) -> bool:
    """Whether `value` is an array of integers (token ids)."""
    import jax.numpy as jnp

    return hasattr(value, "shape") and jnp.issubdtype(value.dtype, jnp.integer)


def refuse_floats(name: str, inputs: Any, features: int, span: Any, where: str) -> None:
    """E-SHAPE-002 unless `inputs` are floats [..., features]."""
    import jax.numpy as jnp

    shape = getattr(inputs, "shape", None)
    if (
        shape is not None
        and len(shape) >= 1
        and shape[-1] == features
        and jnp.issubdtype(inputs.dtype, jnp.floating)
    ):
        return
    raise fail(
        "E-SHAPE-002",
        f"`{name}`{where} takes floats [..., {features}], got {kind_of(inputs)}",
        span,
        "integer tokens go through (embedding ...) first"
        if is_tokens(inputs)
        else f"pass an array whose last axis has {features} features",
    )


@dataclass(frozen=True)
class EmbeddingSpec(ModelSpec):
    """A learned table: integer tokens [...] -> [..., dim] (`weight` [vocab, dim],
    Flax NNX's default initialisation, normal with variance 1/dim)."""

    vocab: int
    dim: int
    name = "embedding"

    def build(self, rngs: Any) -> Any:
        from .nn_modules import Embedding

        return Embedding(self.vocab, self.dim, rngs=rngs)

    def takes(self) -> int | None:
        return None

    def gives(self) -> int:
        return self.dim

    def forward(self, module: Any, inputs: Any, span: Any, where: str = "") -> Any:
        """[..., dim] embeddings of integer tokens [...]."""
        if not is_tokens(inputs):
            raise fail(
                "E-SHAPE-002",
                f"`embedding`{where} takes integer tokens, got {kind_of(inputs)}",
                span,
                "put the embedding first, on an :i32 field",
            )
        return module(inputs)


@dataclass(frozen=True)
class LinearSpec(ModelSpec):
    """`x @ weight + bias` over the last axis: `weight` [in, out] (LeCun normal,
    NNX's default), `bias` [out] (zeros; left out with `:bias false`)."""

    features_in: int
    features_out: int
    bias: bool
    name = "linear"

    def build(self, rngs: Any) -> Any:
        from flax import nnx

        return nnx.Linear(
            self.features_in, self.features_out, use_bias=self.bias, rngs=rngs
        )

    def takes(self) -> int | None:
        return self.features_in

    def gives(self) -> int:
        return self.features_out

    def forward(self, module: Any, inputs: Any, span: Any, where: str = "") -> Any:
        """[..., out] of floats [..., in]."""
        refuse_floats("linear", inputs, self.features_in, span, where)
        return module(inputs)


@dataclass(frozen=True)
class MLPSpec(ModelSpec):
    """Linear layers between consecutive `dims`, numbered from 0, with the
    activation between them (none after the last)."""

    dims: tuple[int, ...]
    activation: str
    bias: bool
    name = "mlp"

    def build(self, rngs: Any) -> Any:
        from .nn_modules import MLP

        return MLP(self.dims, self.activation, self.bias, rngs=rngs)

    def takes(self) -> int | None:
        return self.dims[0]

    def gives(self) -> int:
        return self.dims[-1]

    def forward(self, module: Any, inputs: Any, span: Any, where: str = "") -> Any:
        """[..., dims[-1]] of floats [..., dims[0]]."""
        refuse_floats("mlp", inputs, self.dims[0], span, where)
        return module(inputs)


@dataclass(frozen=True)
class LayerNormSpec(ModelSpec):
    """Layer normalisation over the last axis (`nnx.LayerNorm`): `scale` [dim]
    (ones) and `bias` [dim] (zeros)."""

    dim: int
    eps: float
    name = "layer-norm"

    def build(self, rngs: Any) -> Any:
        from flax import nnx

        return nnx.LayerNorm(self.dim, epsilon=self.eps, rngs=rngs)

    def takes(self) -> int | None:
        return self.dim

    def gives(self) -> int:
        return self.dim

    def forward(self, module: Any, inputs: Any, span: Any, where: str = "") -> Any:
        """Floats [..., dim], normalised."""
        refuse_floats("layer-norm", inputs, self.dim, span, where)
        return module(inputs)


@dataclass(frozen=True)
class SequentialSpec(ModelSpec):
    """Its layers applied in order; layer i's parameters are `model.i.*`."""

    layers: tuple[ModelSpec, ...]
    name = "sequential"

    def build(self, rngs: Any) -> Any:
        from .nn_modules import Sequential

        return Sequential([layer.build(rngs) for layer in self.layers])

    def probe(self) -> ModelSpec:
        return SequentialSpec(tuple(layer.probe() for layer in self.layers))

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        """Layer i's names with `model.i.` in place of `model.`, layer by layer
        (each layer's own, so a deep `gpt` layer costs what it costs alone)."""
        return {
            f"model.{index}.{name[len('model.') :]}": shape
            for index, layer in enumerate(self.layers)
            for name, shape in layer.parameter_shapes().items()
        }

    def takes(self) -> int | None:
        return self.layers[0].takes()

    def gives(self) -> int:
        return self.layers[-1].gives()

    def forward(self, module: Any, inputs: Any, span: Any, where: str = "") -> Any:
        """The last layer's output; each layer checks what it receives."""
        x = inputs
        for index, (layer, part) in enumerate(
            zip(self.layers, module.layers, strict=True)
        ):
            x = layer.forward(part, x, span, f" (layer {index} of `sequential`)")
        return x
