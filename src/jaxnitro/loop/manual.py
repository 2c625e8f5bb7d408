"""Manual mode's step program: the experiment's own `train_step`, compiled.

It runs in the train program of the automatic mode (`compile/scanned.py`) in place
of the automatic step, so the epoch loop (`calls.py`) runs it as it runs the
automatic one, one to steps_per_call steps a call, and everything around the step
(prefetch, the loss read-back and divergence check, train lines, validation,
checkpoints, resume, phases, progress, stopping) is the same code:

    step(values, Weights, model_state, batch, hp, rng)
        -> (Weights, model_state, StepOutputs)

`rng` (uint32[3]) is what `jaxnitro.step_rng()` folds into the step's key.

The manual optimizer states travel in `Weights.opt_state` (a tree of `OptState`s,
each carrying its Optax transformation as static metadata), donated with the
parameters. What `train_step` returns is checked while it is traced, so a wrong
return fails at the first step, before anything is committed or checkpointed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from ..compile.boundary import StepOutputs, Weights
from ..compile.programs import TraceContext
from ..compile.scanned import StepBody
from ..errors import HookError
from ..experiment.modes import training_mode
from ..experiment.rng import step_rng_scope
from ..optim.manual import bind_hyperparams, python_number

RETURN_KEYS = ("loss", "params", "state", "opt_state", "stats")
RETURN_SHAPE = (
    "train_step must return a dict with exactly the keys loss, params, state, "
    "opt_state, stats; {problem}. Return "
    '{{"loss": loss, "params": params, "state": state, "opt_state": opt_state, '
    '"stats": {{}}}}.'
)
PYTHON_SCALAR = (
    "train_step returned a Python {kind} ({value!r}) at {path}: inside the compiled "
    "step a Python number is a constant frozen at trace time, not a computed value. "
    "Return a JAX array computed from the step's inputs (jnp.asarray if it really is "
    "a constant)."
)
STRUCTURE = (
    "train_step returned {name} whose tree structure differs from the {name} it was "
    "given: {detail}. The structure must stay the same from step to step (the step "
    "is compiled once, and checkpoints restore into it); return every entry, "
    "updated or as it came in."
)


def _check_return(result: Any) -> Mapping[str, Any]:
    """The `train_step` return, as a Mapping with exactly `RETURN_KEYS`."""
    if not isinstance(result, Mapping):
        problem = f"it returned {type(result).__name__}"
        raise HookError(RETURN_SHAPE.format(problem=problem))
    missing = [k for k in RETURN_KEYS if k not in result]
    extra = [str(k) for k in result if k not in RETURN_KEYS]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing: {', '.join(missing)}")
        if extra:
            parts.append(f"unexpected: {', '.join(extra)}")
        raise HookError(RETURN_SHAPE.format(problem="; ".join(parts)))
    return result


def _check_arrays(name: str, tree: Any) -> None:
    """Refuse a Python number anywhere in `tree`, naming its key path."""
    found = python_number(tree)
    if found is not None:
        path, leaf = found
        raise HookError(
            PYTHON_SCALAR.format(
                kind=type(leaf).__name__, value=leaf, path=f"{name}{path}"
            )
        )


def _check_structure(name: str, given: Any, returned: Any) -> None:
    """Refuse a returned tree whose structure differs from the one given."""
    before: Any = jax.tree.structure(given)
    after: Any = jax.tree.structure(returned)
    if before == after:
        return
    old = {
        jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(given)
    }
    new = {
        jax.tree_util.keystr(p)
        for p, _ in jax.tree_util.tree_leaves_with_path(returned)
    }
    gone, added = sorted(old - new), sorted(new - old)
    if gone or added:
        detail = "; ".join(
            part
            for part in (
                f"missing {name}{', '.join(gone)}" if gone else "",
                f"new {name}{', '.join(added)}" if added else "",
            )
            if part
        )
    else:
        detail = f"{before} became {after}"
    raise HookError(STRUCTURE.format(name=name, detail=detail))


def manual_step_fn(
    ctx: TraceContext,
    names: tuple[str, ...],
    exposed: tuple[tuple[str, str], ...],
) -> Callable[..., Any]:
    """The manual step program's traced function: `train_step` on one batch, in
    train mode, its return checked. `exposed`: every `(subtree, field)` the
    optimizer states expose (`OptimizerPlan.manual_targets`), scheduled or not;
    this step's `(value, scheduled)` of each (`hp.manual`, in that order) is
    bound into the optimizer states first (`bind_hyperparams`)."""

    def step(device_values, weights, state, batch, hp, rng):
        opt_state = weights.opt_state
        if exposed:
            values = dict(zip(exposed, hp.manual, strict=True))
            opt_state = bind_hyperparams(opt_state, values)
        view = ctx.make_view(device_values)
        with training_mode(True), step_rng_scope(rng):
            result = ctx.hooks["train_step"](
                view,
                ctx.model,
                weights.params,
                opt_state,
                state,
                **{k: batch[k] for k in names},
            )
        out = _check_return(result)
        loss, stats = out["loss"], out["stats"]
        _check_arrays("loss", loss)
        if jnp.ndim(loss) != 0:
            raise HookError(
                f"train_step's loss must be a scalar; it has shape "
                f"{jnp.shape(loss)}. Reduce it over the batch (e.g. `.mean()`)."
            )
        if not isinstance(stats, Mapping):
            raise HookError(
                f"train_step's stats must be a dict of scalars ({{}} for none); it "
                f"returned {type(stats).__name__}."
            )
        for name, given in (
            ("params", weights.params),
            ("opt_state", opt_state),
            ("state", state),
        ):
            _check_arrays(name, out[name])
            _check_structure(name, given, out[name])
        _check_arrays("stats", dict(stats))
        new = Weights(out["params"], out["opt_state"], weights.ema)
        return new, out["state"], StepOutputs(loss, {}, dict(stats), None)

    return step


def manual_call_step(
    ctx: TraceContext,
    names: tuple[str, ...],
    exposed: tuple[tuple[str, str], ...],
) -> StepBody:
    """Manual mode's step as the train program runs it (`compile/scanned.py`):
    `manual_step_fn`, with the accumulator (None: manual mode refuses accum > 1)
    passed through. Which of the `exposed` hyperparameters a run schedules is an
    input (`hp.manual`), never part of the program."""
    step = manual_step_fn(ctx, names, exposed)

    def one_step(device_values, weights, state, accumulator, batch, hp, rng):
        weights, state, reported = step(device_values, weights, state, batch, hp, rng)
        return weights, state, accumulator, reported

    return one_step
