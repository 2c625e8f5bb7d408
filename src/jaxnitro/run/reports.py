"""What a `Nitro` shows of itself: frozen values, reports, the stale check.

Functions of the handle, reading only its public face; `Nitro` calls them from
its methods of the same names (`frozen`, `params_to_log`, `binding_report`,
`repr`, the rich view, the stale check before each verb).
"""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from ..data.prefetch import prefetch_report
from ..data.protocol import dropped_samples
from ..errors import ConfigError
from ..experiment.field_table import summarize
from ..experiment.hooks import (
    current_class,
    hook_fingerprints,
)
from ..experiment.markers import Kind
from ..experiment.traits import config_metadata, field_names
from ..experiment.values import to_host_value
from ..logging import protocol as logproto
from ..observe import report as report_text
from ..observe.report import (
    emit_stale_report,
    frozen_table,
    frozen_values,
    show_report,
    stale_report,
)
from .accessors import (
    NOT_PASSED,
    SCALAR_ACCESSORS,
    differs,
    safe_accessor,
)
from .setup_checks import check_monitor

if TYPE_CHECKING:
    from .view import RunView


def frozen(nitro: RunView) -> dict[str, Any]:
    """The values this handle fixed at construction."""
    c = nitro.config
    values: dict[str, Any] = {"seed": c.seed}
    if c.preset is not None:
        values["preset"] = c.preset
    values["accum"] = c.accum
    values["max_epochs"] = c.max_epochs
    if "train" in nitro.data:
        values["total"] = nitro.prepared.total_steps
    values["clip"] = c.gradient_clip_norm
    values["run_dir"] = c.run_dir
    return values


def _holding(nitro: RunView, restored_best: bool) -> str | None:
    """What weights the handle holds when not the ones it trained to: after
    restore_best, the best checkpoint's file (or what the average averaged)."""
    if not restored_best:
        return None
    path = nitro.checkpoint_source
    if path is not None:
        run_dir = os.path.abspath(nitro.config.run_dir)
        if os.path.dirname(os.path.abspath(path)) == run_dir:
            path = f"{os.path.basename(path)} in run_dir"
        return f"holding the best checkpoint {path} (restore_best)"
    epochs = (nitro.averaged_from or {}).get("epochs", [])
    return f"holding the average of epochs {', '.join(map(str, epochs))} (restore_best)"


def rich_view(nitro: RunView, *, restored_best: bool) -> Any:
    """The frozen values as a rich table (a terminal); `repr` is the plain text."""
    holding = _holding(nitro, restored_best)
    return frozen_table(
        f"Nitro({nitro.prepared.cls.__name__}) values fixed at construction",
        frozen(nitro),
        f"step {nitro.current_step}   epoch {nitro.current_epoch}   phase "
        f"{type(nitro.phase).__name__}   "
        f"(rebuild the Nitro to change them)" + (f"\n{holding}" if holding else ""),
    )


def text_view(nitro: RunView, *, restored_best: bool) -> str:
    """The frozen values, the position and the phase as plain text (`repr`)."""
    holding = _holding(nitro, restored_best)
    return (
        f"Nitro({nitro.prepared.cls.__name__}) values fixed at construction "
        f"(rebuild the `Nitro` to change them)\n  {frozen_values(frozen(nitro))}\n"
        f"  step {nitro.current_step}   epoch {nitro.current_epoch}   phase "
        f"{type(nitro.phase).__name__}" + (f"\n  {holding}" if holding else "")
    )


def params_to_log(nitro: RunView) -> dict[str, Any]:
    """The flat hyperparameters log_params receives.

    A scalar field logs its value. A non-scalar GraphConst or Device field logs
    as its type name (an array as its type and size), and a non-scalar Host
    field (dataset-sized state, say) is not logged: the spec's per-field rule,
    which is why a config of knobs is better flattened into fields.
    """
    params: dict[str, Any] = {}
    meta = config_metadata(nitro.prepared.cls)
    for name in field_names(nitro.prepared.cls):
        value = getattr(nitro.experiment, name, None)
        kind = meta[name].kind if name in meta else Kind.GRAPHCONST.value
        if isinstance(value, jax.Array | np.ndarray | np.generic):
            if np.ndim(value) == 0:
                params[name] = to_host_value(value)
            elif kind != Kind.HOST.value:
                params[name] = summarize(value)
        elif value is None or isinstance(value, bool | int | float | str):
            params[name] = value
        elif kind != Kind.HOST.value:
            params[name] = type(value).__name__
    c = nitro.config
    for name in ("seed", "accum", "max_epochs", "gradient_clip_norm", "run_dir"):
        params[name] = getattr(c, name)
    if c.preset is not None:
        params["preset"] = c.preset
    if (
        "train" in nitro.prepared.prefetch
    ):  # the resolved prefetch settings, as the spec's
        params.update(prefetch_report(nitro.prepared.prefetch["train"]))
    return params


def begin_setup_lines(
    nitro: RunView, eval_width: int | None, *, lock_held: bool
) -> bool:
    """At construction: log the parameters and show the binding report (False), or
    show the report and defer the logger lines to the first verb (True).

    They wait for a handle that logs and will take the run directory's lock only
    when it trains (it checkpoints and did not take it at setup for a resume): its
    train() may be refused by another process's lock, and a refused process writes
    nothing into the run directory, its log included. train() writes them once it
    holds the lock, another verb before it runs."""
    config = nitro.config
    if config.logger is None or config.checkpointer is None or lock_held:
        log_setup(nitro, eval_width)
        return False
    logproto.require_verbs(config.logger, "log_params", "log_other")
    show_setup(nitro, eval_width)
    return True


def log_setup(nitro: RunView, eval_width: int | None) -> None:
    """Log the parameters (before any compile) and show the binding report."""
    log_setup_lines(nitro, eval_width)
    show_setup(nitro, eval_width)


def log_setup_lines(nitro: RunView, eval_width: int | None) -> None:
    """Give the logger the parameters and the binding report."""
    report = binding_report(nitro, eval_width)
    logproto.log_params(nitro.config.logger, params_to_log(nitro))
    logproto.log_other(nitro.config.logger, "binding_report", report)


def show_setup(nitro: RunView, eval_width: int | None) -> None:
    """Show the binding report (rich on a terminal, a log record otherwise)."""
    report = binding_report(nitro, eval_width)
    show_report(f"jaxnitro: {nitro.prepared.cls.__name__}", report)


def binding_report(nitro: RunView, eval_width: int | None) -> str:
    """Where each configured value bound, the data, and the routed fields;
    `eval_width`: the eval programs' batch width, once fixed."""
    routing: dict[str, tuple[str, ...]] = {}
    if "train" in nitro.data:
        g = nitro.prepared.routing.gradient_fields
        assert g is not None
        routing["forward"] = g.forward
        routing["loss"] = g.loss
        if g.train_metrics is not None:
            routing["train_metrics"] = g.train_metrics
    notes = []
    plan = nitro.prepared.plan
    if plan is not None:
        groups = ", ".join(
            f"{g.name} (level {g.rule.level}, lr x{g.lr_ratio:g}"
            + (f", decay {g.weight_decay:g}" if g.decays else "")
            + (", anchored" if g.anchor is not None else "")
            + ")"
            for g in plan.groups
        )
        notes.append(f"learning_rate {plan.base_lr:g}; groups: {groups}")
        for s in plan.schedules:
            where = s.target.namespace + (
                f".{s.target.group}" if s.target.group else ""
            )
            plateau = " (Plateau)" if s.plateau is not None else ""
            notes.append(f"schedule {s.key} -> {where}.{s.target.name}{plateau}")
        notes.append(f"grad_rule {plan.grad_rule!r}")
        if plan.ema is not None:
            notes.append(f"ema {plan.ema!r}, eval_weights {nitro.config.eval_weights}")
    if eval_width is not None:
        notes.append(f"eval batch width {eval_width}")
    per_call = nitro.config.steps_per_call
    notes.append(
        f"steps_per_call {per_call} ({nitro.config.sources['steps_per_call']})"
    )
    if "train" in nitro.data:
        dropped = dropped_samples(nitro.data["train"])
        notes.append(
            "train drop-last discards "
            + (
                f"{dropped} samples an epoch"
                if dropped is not None
                else "an unknown number of samples (the source does not say)"
            )
        )
    if "train" in nitro.prepared.prefetch:
        entries = prefetch_report(nitro.prepared.prefetch["train"])
        notes.append(
            "train prefetch: " + ", ".join(f"{k} {v}" for k, v in entries.items())
        )
    return report_text.binding_report(
        nitro.prepared.cls.__name__,
        nitro.config.reported(),
        nitro.prepared.split_sizes,
        routing,
        notes,
    )


# ------------------------------------------------------------- stale check ------
def check_stale(nitro: RunView, entry: str) -> None:
    """Warn when the class's accessors or hooks changed since the handle froze
    them (an autoreload), naming what changed."""
    now_cls = current_class(nitro.prepared.cls)
    names = SCALAR_ACCESSORS if entry == "train" else ("seed", "run_dir")
    changes = {}
    for name in names:
        if nitro.config.sources[name] == "keyword":
            continue  # the handle uses the keyword, whatever the accessor says
        then = nitro.prepared.accessor_snapshot.get(name, NOT_PASSED)
        now = safe_accessor(nitro.experiment, name, now_cls)
        if then is NOT_PASSED or now is NOT_PASSED:
            continue
        if name == "monitor":
            then, now = _as_monitor(then), _as_monitor(now)
        if differs(then, now):
            changes[name] = (then, now)
    prints = hook_fingerprints(now_cls)
    redefined = sorted(
        name
        for name in prints.keys() | nitro.prepared.hook_prints.keys()
        if prints.get(name) != nitro.prepared.hook_prints.get(name)
    )
    emit_stale_report(stale_report(nitro.prepared.cls.__name__, changes, redefined))


def _as_monitor(value: Any) -> Any:
    """A monitor as the handle reads it ("val_loss" is "loss"), to compare; a value
    that is not a valid monitor compares as it is. The deprecation was shown at
    setup, so it is not repeated here."""
    if value is None:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            return check_monitor(value)
        except ConfigError:
            return value
