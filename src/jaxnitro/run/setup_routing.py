"""Routing and the split checks, resolved once at setup from one batch (a mixin).

Which batch fields each hook receives (`routing.HookFields`), the fields the training
programs take, the train split's batch size with its accum and partial-batch checks,
the eval programs' batch width, and where each metric hook runs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..data.sources import batch_size, first_batch, probe_split
from ..errors import ConfigError
from ..experiment.hooks import hook_function
from ..experiment.routing import HookFields, hook_fields
from .config import RunConfig
from .setup_checks import check_numeric_fields, partial_batch_message


class RoutingSetup:
    """The routing steps of the setup sequence; `SetupSequence` runs them."""

    _hooks: dict[str, Any]
    _run_config: RunConfig
    _split_sizes: dict[str, int]
    _cls: Any
    _experiment: Any
    data: dict[str, Any]

    def _probe_routing(self) -> None:
        """Resolve routing from one batch, and check the train split's shape."""
        self._fields: dict[str, HookFields] = {
            name: hook_fields(name, self._hooks[name])
            for name in ("forward", "loss", "metrics", "train_metrics")
            if name in self._hooks
        }
        self._train_fields: tuple[str, ...] = ()
        self._train_batch: int | None = None
        self._eval_width: int | None = None
        self._sample_shapes: dict[str, tuple[int, ...]] = {}
        probes: dict[str, Any] = {}  # first batches already read, reused below
        if "train" in self.data:
            source = self.data["train"]
            batch, last = probe_split("train", source, last=True)
            probes["train"] = batch
            keys = tuple(batch)
            self._gradient_fields = self._route_training(keys)
            self._train_fields = tuple(
                dict.fromkeys(
                    self._gradient_fields.forward
                    + self._gradient_fields.loss
                    + (self._gradient_fields.train_metrics or ())
                )
            )
            check_numeric_fields(batch, self._train_fields, "train")
            self._train_batch = batch_size(batch, self._train_fields)
            count, accum = self._split_sizes["train"], self._run_config.accum
            if count % accum:
                raise ConfigError(
                    f"The train split has {count} batches, which does not divide by "
                    f"accum={accum} ({count} % {accum} = {count % accum}): every "
                    f"optimizer step takes {accum} micro-batches. Change the batch "
                    f"size or accum so the batch count divides."
                )
            if count == 0:
                raise ConfigError("The train split has no batches.")
            if last is not None:
                last_size = batch_size(last, self._train_fields)
                if last_size != self._train_batch:
                    raise ConfigError(
                        partial_batch_message(last_size, self._train_batch)
                    )
        # The eval programs' batch width: the first batch of val, else test, else
        # any split; with no data at all, the first batch predict is handed.
        usual = ("val", "test", "train")
        order = [n for n in usual if n in self.data]
        order += [n for n in self.data if n not in usual]
        for name in order:
            if self._split_sizes[name] > 0:
                probe = probes.get(name)
                if probe is None:
                    probe = first_batch(name, self.data[name])
                forward = self._fields["forward"].select(tuple(probe))
                # The loss's fields too, where the split has them: an unbatched
                # source (per-sample fields of unrelated lengths) is caught here,
                # not at the first padded forward.
                loss = self._fields["loss"]
                labels = (
                    ()
                    if loss.takes_all
                    else tuple(f for f in loss.required if f in probe)
                )
                self._eval_width = batch_size(probe, dict.fromkeys(forward + labels))
                probes["eval"] = probe
                break
        first = probes.get("train", probes.get("eval"))
        if first is not None:  # what a sample looked like, to explain a mismatch
            self._sample_shapes = {k: tuple(np.shape(v))[1:] for k, v in first.items()}

    def _route_training(self, keys: tuple[str, ...]) -> Any:
        from ..compile.programs import GradientFields

        device_tm = (
            "train_metrics" in self._fields
            and self._residency("train_metrics") == "device"
        )
        return GradientFields(
            forward=self._fields["forward"].select(keys),
            loss=self._fields["loss"].select(keys),
            train_metrics=(
                self._fields["train_metrics"].select(keys) if device_tm else None
            ),
            host_outputs="train_metrics" in self._fields and not device_tm,
        )

    def _residency(self, hook: str) -> str:
        """Where metric hook `hook` runs, resolved once and frozen with the handle."""
        frozen = self.__dict__.setdefault("_residencies", {})
        if hook not in frozen:
            where = hook_function(self._cls, "metrics_residency")(
                self._experiment, hook
            )
            if where not in ("host", "device"):
                raise ConfigError(
                    f'metrics_residency({hook!r}) must return "host" or "device", '
                    f"got {where!r}."
                )
            frozen[hook] = str(where)
        return str(frozen[hook])
