"""The programs a run compiles, and how each is keyed and compiled.

| program      | computes                                  | donated                 |
| train_step   | 1 to K optimizer steps a call             | params, opt state, EMA, |
|              | (`scanned.py`): each micro-batch's        | the accumulator         |
|              | gradient (`gradient_fn`), the optimizer   |                         |
|              | step, loss terms, train_metrics           |                         |
| manual_step  | the same loop around the experiment's own | params, opt state       |
|              | `train_step` (`loop/manual.py`)           |                         |
| eval_forward | forward in eval mode                      | nothing                 |
| eval_metrics | metrics, when their residency is device   | nothing                 |
| eval_loss    | loss on eval outputs                      | nothing                 |

Every program receives the experiment's Device fields as a plain dict and rebuilds the
stripped view inside the trace, so a compiled program never depends on the identity of
the experiment class object (a reloaded class with unchanged code still hits).

Each kind is declared once (`kinds.py`), its arguments a typed tuple beside its
builder (`EvalForwardArgs`, ..., `scanned.TrainCallArgs`).

On a mesh (n_devs > 1) each program compiles with explicit shardings, from the role of
each argument and result (its declaration's `Layout`): the batch split along the data
axis (a block of batches along its batch axis, behind the block's), the
training state as the run's `Placement` lays it out, the rest replicated. The
executable places what it is given before each call, so a value from anywhere (a
restore, a NumPy scalar, a host batch) arrives where the program expects it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import jax.numpy as jnp

from ..devices.placement import Placement, Role, put
from ..errors import HookError
from ..experiment.modes import training_mode
from ..experiment.rng import EVAL_RNG_INPUT, step_rng_scope
from ..experiment.view import replace_fields
from ..keys.fingerprint import fingerprint
from ..keys.program_key import Identity, ProgramKey, abstract_signature, typed_key
from ..metrics import flatten_metrics
from .boundary import StepOutputs
from .cache import CompileCache
from .optimizer_step import OptimizerStep
from .precision import cast_floating, compute_dtype, like_dtypes

if TYPE_CHECKING:
    from .declaration import Program


def model_key(model: Any) -> Any:
    """The model's static part as a key: its code and state, plus its value or
    identity. A function model (an apply function) keys by its code and what it
    reads; an object by its class, its fields (also those its `==` ignores) and
    its value, or its identity when it does not hash."""
    try:
        hash(model)
        value: Any = model
    except TypeError:
        value = Identity(model)
    return (fingerprint(model), typed_key(value))


# Where a program's arguments and results go on a mesh, by position: each argument's
# role, and each result's role or the position of the argument whose layout it keeps
# (the donated state comes back as it went in); None leaves the results' layout to
# XLA. A declaration names them by field (`declaration.Layout`), resolved once.
Placed = tuple[tuple[Role, ...], tuple["Role | int", ...] | None]


class PlacedExecutable:
    """A compiled program on a mesh that first places its arguments as compiled
    (`jax.device_put` keeps a value already there, so a donation still donates).
    Other attributes (`cost_analysis`, `as_text`, ...) are the executable's."""

    def __init__(self, compiled: Any, shardings: tuple[Any, ...]) -> None:
        self.compiled = compiled
        self.shardings = shardings

    def __call__(self, *args: Any) -> Any:
        return self.compiled(*put(args, self.shardings))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.compiled, name)


def _shardings(placement: Placement, layout: Placed, args: tuple[Any, ...]) -> Any:
    """`(in_shardings, out_shardings or None)` of a program laid out as `layout`
    for `args`."""
    inputs, outputs = layout
    given = tuple(placement.shardings(a, r) for a, r in zip(args, inputs, strict=True))
    if outputs is None:
        return given, None
    out = tuple(
        given[role] if isinstance(role, int) else placement.shardings(0, role)
        for role in outputs
    )
    return given, out[0] if len(out) == 1 else out


@dataclass
class TraceContext:
    """What one handle's programs close over: the view, the hooks, the model.

    Attributes:
        cls: the experiment class.
        view: `compile_view` of the experiment; its Device fields are replaced by the
            traced values inside each program.
        device_names: the Device fields, passed to every program as a dict.
        hooks: the hook functions frozen at construction, called as `hook(view, ...)`.
        model: the static model object `build_model` returned.
        graphconst: the GraphConst values, for the cache key.
        compile_options: XLA compiler options for every program, for the key too.
        precision: "f32" or "bf16": the dtype `forward` computes in
            (`compile.precision`), for the key too.
        placement: the run's mesh and layout (n_devs > 1), in the key too; None
            runs every program on the default device.
    """

    cls: type
    view: Any
    device_names: tuple[str, ...]
    hooks: dict[str, Callable[..., Any]]
    model: Any
    graphconst: tuple[tuple[str, Any], ...]
    compile_options: dict[str, Any] = field(default_factory=dict)
    precision: str = "f32"
    placement: Placement | None = None

    def make_view(self, device_values: Mapping[str, Any]) -> Any:
        return replace_fields(self.view, **device_values)

    def code_fingerprint(self, traced: tuple[str, ...]) -> str:
        """The fingerprint of the hooks in `traced` and of everything they call.

        Taken afresh for every key, right before a trace would read the same code: a
        memo could key a program traced from a helper redefined since.
        """
        return fingerprint(*(self.hooks[hook] for hook in traced), owner=self.cls)

    def key(self, program: Program, args: tuple[Any, ...]) -> ProgramKey:
        """The cache key of `program` (its declaration's constants, the code of the
        hooks it traces) for `args`, with what this context adds."""
        baked = {**program.constants(), "precision": self.precision}
        return ProgramKey(
            kind=program.kind,
            experiment=(self.cls.__module__, self.cls.__qualname__),
            graphconst=self.graphconst,
            code=self.code_fingerprint(program.traced),
            model=model_key(self.model),
            signature=abstract_signature(args),
            baked=tuple(sorted(baked.items()))
            + (("placement", self.placement and self.placement.key()),),
            compile_options=tuple(sorted(self.compile_options.items())),
        )

    def compile(
        self,
        cache: CompileCache,
        program: Program,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        *,
        on_compile: Callable[[str], Any] | None = None,
    ) -> Any:
        """The compiled executable of `fn` for `args`, from the cache or compiled now.

        `program` declares what `fn` is: its kind, the hooks it traces, every host
        constant it captures that the key does not otherwise see, what it donates
        and its layout. On a mesh the arguments are placed first, so the key sees
        the shardings the program runs with.
        """
        kind = program.kind
        args = tuple(args)  # a typed argument tuple travels as the plain one
        placement = self.placement
        shardings: Any = None
        if placement is not None:
            shardings = _shardings(placement, program.placed, args)
            args = put(args, shardings[0])
        key = self.key(program, args)
        donate = program.argnums

        def build() -> Any:
            if on_compile is not None:
                on_compile(kind)
            named = _named(fn, kind)
            options = self.compile_options or None
            if shardings is None:
                lowered = jax.jit(named, donate_argnums=donate).lower(*args)
                return lowered.compile(compiler_options=options)
            given, out = shardings
            jitted = jax.jit(
                named,
                in_shardings=given,
                donate_argnums=donate,
                **({} if out is None else {"out_shardings": out}),
            )
            compiled = jitted.lower(*args).compile(compiler_options=options)
            return PlacedExecutable(compiled, given)

        return cache.get_or_compile(key, build)


def _named(fn: Callable[..., Any], kind: str) -> Callable[..., Any]:
    """`fn` under the program's kind, so XLA's module (`jit_train_step`) and every
    profiler trace and HLO dump name the program, not an inner closure."""

    def program(*args: Any) -> Any:
        return fn(*args)

    program.__name__ = program.__qualname__ = kind
    return program


def call_forward(
    ctx: TraceContext, view: Any, params: Any, state: Any, batch: Mapping[str, Any]
) -> tuple[Any, Any]:
    """Call the frozen forward hook and check it returned `(outputs, new_state)`.

    Under a reduced precision (`compile.precision`) the parameters, the batch's
    floating fields and the floating Device fields are cast to the compute dtype
    as forward reads them, and its floating outputs come back as float32; the new
    model state keeps the state's own dtypes.
    """
    compute = compute_dtype(ctx.precision)
    if compute is not None:
        params = cast_floating(params, compute)
        batch = cast_floating(batch, compute)
        devices = {name: getattr(view, name) for name in ctx.device_names}
        view = replace_fields(view, **cast_floating(devices, compute))
    result = ctx.hooks["forward"](view, ctx.model, params, state, **batch)
    if not (isinstance(result, tuple) and len(result) == 2):
        raise HookError(
            "`forward` must return (outputs, new_state); it returned "
            f"{type(result).__name__}. Return the state unchanged for a stateless "
            "model: `return outputs, state`."
        )
    if compute is None:
        return result
    outputs, new_state = result
    return cast_floating(outputs, jnp.float32), like_dtypes(new_state, state)


def split_loss(value: Any) -> tuple[Any, dict[str, Any]]:
    """`loss` returns a scalar or `(scalar, terms)`; split them."""
    if isinstance(value, tuple):
        if len(value) != 2 or not isinstance(value[1], Mapping):
            raise HookError(
                "`loss` must return a scalar or (scalar, terms) with terms a dict of "
                f"scalars; it returned a tuple of {len(value)}."
            )
        return value[0], dict(value[1])
    return value, {}


def _check_scalar_loss(loss: Any) -> None:
    if jnp.ndim(loss) != 0:
        raise HookError(
            f"`loss` must return a scalar; it returned shape {jnp.shape(loss)}. Reduce "
            "it over the batch (e.g. `.mean()`) inside `loss`."
        )


@dataclass(frozen=True)
class GradientFields:
    """The batch fields each traced training hook receives."""

    forward: tuple[str, ...]
    loss: tuple[str, ...]
    train_metrics: tuple[str, ...] | None  # None: no device train_metrics
    host_outputs: bool  # return the outputs for host-side train_metrics


def gradient_fn(
    ctx: TraceContext, fields: GradientFields, plan: OptimizerStep
) -> Callable:
    """The gradient computation of one micro-batch, traced into the train program
    (`compile/scanned.py`): `(values, params, model_state, batch, grad_hp, rng) ->
    (grads, model_state, StepOutputs)` with the loss, its terms and the device
    train_metrics.

    Under a perturbation rule (SAM, ASAM) the gradient is taken a second time at
    `params + eps`; the loss, state, terms and train_metrics are the first pass's.
    `rng` (uint32[3]: seed, step, micro-batch; `experiment/rng.py`) is what
    `step_rng()` folds into the step's key.
    """

    def compute(device_values, params, state, batch, grad_hp, rng):
        view = ctx.make_view(device_values)
        with training_mode(True), step_rng_scope(rng):

            def objective(p):
                outputs, new_state = call_forward(
                    ctx, view, p, state, {k: batch[k] for k in fields.forward}
                )
                loss, terms = split_loss(
                    ctx.hooks["loss"](
                        view, outputs, **{k: batch[k] for k in fields.loss}
                    )
                )
                _check_scalar_loss(loss)
                return loss, (outputs, new_state, terms)

            differentiate = jax.value_and_grad(objective, has_aux=True)
            (loss, (outputs, new_state, terms)), grads = differentiate(params)
            if plan.perturbs:
                eps = plan.grad_rule.perturbation(
                    grads, params, grad_hp["masks"], grad_hp["values"]
                )
                shifted = jax.tree.map(lambda p, e: p + e, params, eps)
                _, grads = differentiate(shifted)
            stats = {}
            if fields.train_metrics is not None:
                stats = ctx.hooks["train_metrics"](
                    view, outputs, **{k: batch[k] for k in fields.train_metrics}
                )
        extra = outputs if fields.host_outputs else None
        return grads, new_state, StepOutputs(loss, terms, stats, extra)

    return compute


class EvalForwardArgs(NamedTuple):
    """The eval forward program's arguments."""

    values: Any  # the Device fields, by name
    params: Any  # the parameters evaluated (the EMA's where it evaluates)
    model_state: Any
    batch: Any  # the routed fields, padded to the eval width: (width, ...)


class EvalMetricsArgs(NamedTuple):
    """The eval metrics program's arguments."""

    values: Any  # the Device fields, by name
    outputs: Any  # forward's outputs, sliced to the chunk's samples: (n, ...)
    batch: Any  # the fields `metrics` reads: (n, ...)


class EvalLossArgs(NamedTuple):
    """The eval loss program's arguments."""

    values: Any  # the Device fields, by name
    outputs: Any  # forward's outputs, sliced to the chunk's samples: (n, ...)
    batch: Any  # the fields `loss` reads: (n, ...)


def eval_forward_fn(ctx: TraceContext, names: tuple[str, ...]) -> Callable:
    """The eval forward program: forward in eval mode; the new state is dropped."""

    def run(device_values, params, state, batch):
        view = ctx.make_view(device_values)
        with training_mode(False), step_rng_scope(EVAL_RNG_INPUT):
            outputs, _ = call_forward(
                ctx, view, params, state, {k: batch[k] for k in names}
            )
        return outputs

    return run


def eval_metrics_fn(ctx: TraceContext, names: tuple[str, ...]) -> Callable:
    """Device-resident metrics on (already sliced) eval outputs, as `MetricLeaf`s.

    A mode such as "sum" is no array and cannot leave a trace: flattening here puts
    each leaf's mode in the output's static structure, where the host reads it back.
    """

    def run(device_values, outputs, batch):
        view = ctx.make_view(device_values)
        with training_mode(False), step_rng_scope(EVAL_RNG_INPUT):
            return flatten_metrics(
                ctx.hooks["metrics"](view, outputs, **{k: batch[k] for k in names})
            )

    return run


def eval_loss_fn(ctx: TraceContext, names: tuple[str, ...]) -> Callable:
    """The loss on (already sliced) eval outputs, with its terms."""

    def run(device_values, outputs, batch):
        view = ctx.make_view(device_values)
        with training_mode(False), step_rng_scope(EVAL_RNG_INPUT):
            loss, terms = split_loss(
                ctx.hooks["loss"](view, outputs, **{k: batch[k] for k in names})
            )
        _check_scalar_loss(loss)
        return loss, terms

    return run
