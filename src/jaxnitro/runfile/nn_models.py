"""A model value of the run file: named parameters, an init and a forward pass.

A model value (`(gpt ...)`, `(linear ...)`, `(sequential ...)`) is a frozen
declaration. What the rest of the run file reads of it:

- `parameter_shapes()`: every parameter's dotted name (what `(select "glob")` and
  `(select :rank-below n)` see) and shape, in the order of the forward pass;
  `check` counts them, `explain` lists them, the optimizer groups assign them.
- `init(rng)`: the initial values by name, drawn from a JAX key (the run seed's).
- `apply(params, inputs, span)`: the prediction, a pure function of the parameters
  by name; `check` traces it with `jax.eval_shape`, the engine inside its programs.

Behind each declaration is a Flax NNX module (`build`, from `nn_modules`). Its
abstract state is split once per declaration (`nnx.split` of `nnx.eval_shape`);
`apply` puts the given arrays into that state and merges it with the graph
(`nnx.merge`) at trace time, so a compiled program holds only the arithmetic.

Names follow from the NNX state paths (`parameter_name`): prefixed with `model.`,
underscores written as hyphens, an `nnx.Linear`'s `kernel` called `weight`, an
`nnx.Embed`'s table named by the attribute that holds it, and the `layers`
container of a `sequential` or an `mlp` left out, so its layers are numbered
directly (`model.0.weight`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ..extras import require
from .source import Span, fail

FORWARD_ORDER = (
    "embed",
    "token",
    "position",
    "blocks",
    "attn-norm",
    "attn",
    "query",
    "key",
    "value",
    "out",
    "mlp-norm",
    "mlp",
    "up",
    "down",
    "norm",
    "head",
    "weight",
    "scale",
    "bias",
)
"""How the parts of a name sort, so parameters are listed as the forward pass
meets them: numbered layers in order, and `weight` before `bias`."""


def nnx() -> ModuleType:
    """`flax.nnx`, or `MissingExtraError` naming the `flax` extra."""
    return require("flax.nnx", extra="flax", feature="the run file's models")


def require_flax(builtin: str, span: Span) -> None:
    """Refuse a model declaration (E-EVAL-018) when Flax is not installed: the
    models are Flax NNX modules, and `check` already traces them."""
    try:
        nnx()
    except ImportError as error:  # MissingExtraError is an ImportError too
        raise fail(
            "E-EVAL-018",
            f"`{builtin}` is a Flax NNX model and Flax is not installed ({error})",
            span,
            "install the flax extra: pip install 'jaxnitro[flax]'",
        ) from None


def parameter_name(path: tuple[Any, ...]) -> str:
    """The run file's name of the NNX parameter at `path` (see the module doc)."""
    parts = ["model"]
    for index, part in enumerate(path):
        text, last = str(part), index == len(path) - 1
        if text == "layers" or (last and text == "embedding"):
            continue
        parts.append("weight" if last and text == "kernel" else text.replace("_", "-"))
    return ".".join(parts)


def _forward_rank(name: str) -> tuple[tuple[int, int | str], ...]:
    key: list[tuple[int, int | str]] = []
    for part in name.split(".")[1:]:
        if part.isdigit():
            key.append((0, int(part)))
        elif part in FORWARD_ORDER:
            key.append((1, FORWARD_ORDER.index(part)))
        else:
            key.append((2, part))
    return tuple(key)


@dataclass(frozen=True)
class Structure:
    """A declaration's NNX graph and its parameters: name -> (state path, the
    abstract `nnx.Param`), in forward order."""

    graphdef: Any
    variables: dict[str, tuple[tuple[Any, ...], Any]]


@functools.lru_cache(maxsize=32)
def structure(model: ModelSpec) -> Structure:
    """The NNX structure of a declaration, built once (abstractly: no arrays)."""
    flax_nnx = nnx()
    abstract = flax_nnx.eval_shape(lambda: model.build(flax_nnx.Rngs(0)))
    graphdef, state = flax_nnx.split(abstract)
    named = {
        parameter_name(path): (path, variable)
        for path, variable in flax_nnx.to_flat_state(state)
    }
    ordered = sorted(named.items(), key=lambda item: _forward_rank(item[0]))
    return Structure(graphdef, dict(ordered))


class ModelSpec:
    """The base of the model declarations: subclasses are frozen dataclasses that
    define `build` (their NNX module) and `forward` (checked inputs, then the
    module's call)."""

    kind = "a model"
    name = "model"
    """The builtin that declares it, for messages."""

    def build(self, rngs: Any) -> Any:
        """The NNX module of this declaration, initialised from `rngs`."""
        raise NotImplementedError

    def forward(self, module: Any, inputs: Any, span: Span, where: str = "") -> Any:
        """The prediction of `inputs` by the merged `module`; refuse inputs of the
        wrong kind (E-SHAPE-002). `where` places a layer in a `sequential`."""
        raise NotImplementedError

    def check_backend(self, span: Span | None) -> None:
        """Refuse an option the run's backend does not compile (a coded
        RunfileError pointing at `span`); nothing by default. The engine calls it
        when it builds the parameters, never `check`: asking for the backend starts
        it, which must wait until the run's processes have joined."""
        del span

    def takes(self) -> int | None:
        """The feature count of the float inputs it takes; None for integer tokens."""
        raise NotImplementedError

    def gives(self) -> int:
        """The size of its output's last axis."""
        raise NotImplementedError

    def probe(self) -> ModelSpec:
        """The smallest model taking and giving what this one does, which `check`
        traces in its place: shape inference per block, not of the unrolled
        model (a `gpt`'s blocks all map [batch, time, dim] to the same, so one
        block stands for all of them)."""
        return self

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every parameter's name (as groups select it) and shape, forward order."""
        return {
            name: tuple(variable.shape)
            for name, (_, variable) in structure(self).variables.items()
        }

    def init(self, rng: Any) -> dict[str, Any]:
        """The initial parameters by name, drawn from the JAX key `rng`."""
        flax_nnx = nnx()
        _, state = flax_nnx.split(self.build(flax_nnx.Rngs(params=rng)))
        values = {
            parameter_name(path): variable[...]
            for path, variable in flax_nnx.to_flat_state(state)
        }
        return {name: values[name] for name in structure(self).variables}

    def apply(self, params: dict[str, Any], inputs: Any, span: Span | None) -> Any:
        """The prediction of `inputs` with the parameters `params` (by name)."""
        flax_nnx = nnx()
        found = structure(self)
        state = flax_nnx.from_flat_state(
            [
                (path, variable.replace(params[name]))
                for name, (path, variable) in found.variables.items()
            ]
        )
        module = flax_nnx.merge(found.graphdef, state)
        return self.forward(module, inputs, span)  # type: ignore[arg-type]
