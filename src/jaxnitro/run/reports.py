"""What a `Nitro` shows of itself: frozen values, reports, the stale check."""

from __future__ import annotations

import os
import warnings
from typing import Any

import jax
import numpy as np

from ..data.prefetch import prefetch_report
from ..data.protocol import dropped_samples
from ..errors import ConfigError
from ..experiment.base import summarize
from ..experiment.hooks import (
    current_class,
    hook_fingerprints,
)
from ..experiment.markers import Kind
from ..experiment.traits import config_metadata, field_names
from ..experiment.values import to_host_value
from ..logging import protocol as logproto
from ..observe.report import (
    binding_report,
    emit_stale_report,
    frozen_table,
    frozen_values,
    show_report,
    stale_report,
)
from .accessors import (
    SCALAR_ACCESSORS,
)
from .setup import NOT_PASSED, SetupSequence, differs, safe_accessor
from .setup_checks import check_monitor


class HandleReports(SetupSequence):
    """What a `Nitro` shows of itself (the handle's base, after its setup)."""

    def frozen(self) -> dict[str, Any]:
        """The values this handle fixed at construction."""
        c = self._run_config
        values: dict[str, Any] = {"seed": c.seed}
        if c.preset is not None:
            values["preset"] = c.preset
        values["accum"] = c.accum
        values["max_epochs"] = c.max_epochs
        if "train" in self.data:
            values["total"] = self.total_steps
        values["clip"] = c.gradient_clip_norm
        values["run_dir"] = c.run_dir
        return values

    def _holding(self) -> str | None:
        """What weights the handle holds when not the ones it trained to: after
        restore_best, the best checkpoint's file (or what the average averaged)."""
        if not self._restored_best:
            return None
        path = self.checkpoint_source
        if path is not None:
            run_dir = os.path.abspath(self._run_config.run_dir)
            if os.path.dirname(os.path.abspath(path)) == run_dir:
                path = f"{os.path.basename(path)} in run_dir"
            return f"holding the best checkpoint {path} (restore_best)"
        epochs = (self.averaged_from or {}).get("epochs", [])
        return (
            f"holding the average of epochs {', '.join(map(str, epochs))} "
            f"(restore_best)"
        )

    def __rich__(self) -> Any:
        """The frozen values as a rich table (a terminal); `repr` is the plain text."""
        holding = self._holding()
        return frozen_table(
            f"Nitro({self._cls.__name__}) values fixed at construction",
            self.frozen(),
            f"step {self.current_step}   epoch {self.current_epoch}   phase "
            f"{type(self.phase_recorder.phase).__name__}   "
            f"(rebuild the Nitro to change them)" + (f"\n{holding}" if holding else ""),
        )

    def __repr__(self) -> str:
        holding = self._holding()
        return (
            f"Nitro({self._cls.__name__}) values fixed at construction (rebuild the "
            f"`Nitro` to change them)\n  {frozen_values(self.frozen())}\n"
            f"  step {self.current_step}   epoch {self.current_epoch}   phase "
            f"{type(self.phase_recorder.phase).__name__}"
            + (f"\n  {holding}" if holding else "")
        )

    def params_to_log(self) -> dict[str, Any]:
        """The flat hyperparameters log_params receives.

        A scalar field logs its value. A non-scalar GraphConst or Device field logs
        as its type name (an array as its type and size), and a non-scalar Host
        field (dataset-sized state, say) is not logged: the spec's per-field rule,
        which is why a config of knobs is better flattened into fields.
        """
        params: dict[str, Any] = {}
        meta = config_metadata(self._cls)
        for name in field_names(self._cls):
            value = getattr(self._experiment, name, None)
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
        c = self._run_config
        for name in ("seed", "accum", "max_epochs", "gradient_clip_norm", "run_dir"):
            params[name] = getattr(c, name)
        if c.preset is not None:
            params["preset"] = c.preset
        if "train" in self._prefetch:  # the resolved prefetch settings, as the spec's
            params.update(prefetch_report(self._prefetch["train"]))
        return params

    def log_setup(self) -> None:
        """Log the parameters (before any compile) and show the binding report."""
        logproto.log_params(self._logger, self.params_to_log())
        report = self.binding_report()
        logproto.log_other(self._logger, "binding_report", report)
        show_report(f"jaxnitro: {self._cls.__name__}", report)

    def binding_report(self) -> str:
        """Where each configured value bound, the data, and the routed fields."""
        routing: dict[str, tuple[str, ...]] = {}
        if "train" in self.data:
            g = self._gradient_fields
            routing["forward"] = g.forward
            routing["loss"] = g.loss
            if g.train_metrics is not None:
                routing["train_metrics"] = g.train_metrics
        notes = []
        if self._plan is not None:
            groups = ", ".join(
                f"{g.name} (level {g.rule.level}, lr x{g.lr_ratio:g}"
                + (f", decay {g.weight_decay:g}" if g.decays else "")
                + (", anchored" if g.anchor is not None else "")
                + ")"
                for g in self._plan.groups
            )
            notes.append(f"learning_rate {self._plan.base_lr:g}; groups: {groups}")
            for s in self._plan.schedules:
                where = s.target.namespace + (
                    f".{s.target.group}" if s.target.group else ""
                )
                plateau = " (Plateau)" if s.plateau is not None else ""
                notes.append(f"schedule {s.key} -> {where}.{s.target.name}{plateau}")
            notes.append(f"grad_rule {self._plan.grad_rule!r}")
            if self._plan.ema is not None:
                notes.append(
                    f"ema {self._plan.ema!r}, "
                    f"eval_weights {self._run_config.eval_weights}"
                )
        if self._eval_width is not None:
            notes.append(f"eval batch width {self._eval_width}")
        if "train" in self.data:
            dropped = dropped_samples(self.data["train"])
            notes.append(
                "train drop-last discards "
                + (
                    f"{dropped} samples an epoch"
                    if dropped is not None
                    else "an unknown number of samples (the source does not say)"
                )
            )
        if "train" in self._prefetch:
            entries = prefetch_report(self._prefetch["train"])
            notes.append(
                "train prefetch: " + ", ".join(f"{k} {v}" for k, v in entries.items())
            )
        return binding_report(
            self._cls.__name__,
            self._run_config.reported(),
            self._split_sizes,
            routing,
            notes,
        )

    # ------------------------------------------------------------- stale check ------
    def _check_stale(self, entry: str) -> None:
        now_cls = current_class(self._cls)
        names = SCALAR_ACCESSORS if entry == "train" else ("seed", "run_dir")
        changes = {}
        for name in names:
            if self._run_config.sources[name] == "keyword":
                continue  # the handle uses the keyword, whatever the accessor says
            then = self._accessor_snapshot.get(name, NOT_PASSED)
            now = safe_accessor(self._experiment, name, now_cls)
            if then is NOT_PASSED or now is NOT_PASSED:
                continue
            if name == "monitor":
                then, now = _as_monitor(then), _as_monitor(now)
            if differs(then, now):
                changes[name] = (then, now)
        prints = hook_fingerprints(now_cls)
        redefined = sorted(
            name
            for name in prints.keys() | self._hook_prints.keys()
            if prints.get(name) != self._hook_prints.get(name)
        )
        emit_stale_report(stale_report(self._cls.__name__, changes, redefined))


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
