"""Routing and the split checks, resolved once at setup from the first batch of
each split (and the train split's last).

Which batch fields each hook receives (`routing.HookFields`), the fields the training
programs take, the train split's batch size with its accum and partial-batch checks,
the eval programs' batch width, and where each metric hook runs; then the run's mesh,
which the probed batch sizes fix (`run_mesh`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..compile.programs import GradientFields
from ..data.sources import batch_size, first_batch, probe_split
from ..devices.distributed import agree_across_processes, world_size
from ..devices.placement import Placement, check_process_batch_divides, padded_width
from ..errors import ConfigError
from ..experiment.hooks import hook_function
from ..experiment.routing import HookFields, hook_fields
from ..loop.prepared import Routing
from .config import RunConfig
from .setup_checks import (
    check_eval_fields,
    check_numeric_fields,
    check_probe_size,
    check_split_counts,
    partial_batch_message,
)


def probe_routing(
    experiment: Any,
    hooks: Mapping[str, Any],
    data: Mapping[str, Any],
    split_sizes: Mapping[str, int],
    config: RunConfig,
) -> tuple[Routing, int | None]:
    """Resolve routing from one batch, and check the train split's shape; the
    routing and the eval programs' batch width (None without data)."""
    fields: dict[str, HookFields] = {
        name: hook_fields(name, hooks[name])
        for name in ("forward", "loss", "metrics", "train_metrics", "train_step")
        if name in hooks
    }
    residency: dict[str, str] = {
        hook: _residency(experiment, hook)
        for hook in ("metrics", "train_metrics")
        if hook in fields
    }
    train_fields: tuple[str, ...] = ()
    gradient_fields: GradientFields | None = None
    train_batch: int | None = None
    eval_width: int | None = None
    sample_shapes: dict[str, tuple[int, ...]] = {}
    sample_dtypes: dict[str, str] = {}
    probes: dict[str, Any] = {}  # first batches already read, reused below
    check_split_counts(split_sizes)
    if "train" in data:
        source = data["train"]
        batch, last = probe_split("train", source, last=True)
        probes["train"] = batch
        keys = tuple(batch)
        gradient_fields = _route_training(fields, residency, keys)
        train_fields = tuple(
            dict.fromkeys(
                gradient_fields.forward
                + gradient_fields.loss
                + (gradient_fields.train_metrics or ())
            )
        )
        if "train_step" in fields:  # manual mode: train_step takes the train batch
            train_fields = fields["train_step"].select(keys)
        check_numeric_fields(batch, train_fields, "train")
        train_batch = batch_size(batch, train_fields)
        check_probe_size("train", train_batch)
        config.accumulation.refuse_split(split_sizes["train"])
        if last is not None:
            last_size = batch_size(last, train_fields)
            check_probe_size("train", last_size, "last")
            if last_size != train_batch:
                raise ConfigError(partial_batch_message(last_size, train_batch))
    _probe_eval_splits(fields, data, probes)
    # The eval programs' batch width: the first batch of val, else test, else
    # any split; with no data at all, the first batch predict is handed.
    usual = ("val", "test", "train")
    order = [n for n in usual if n in data]
    order += [n for n in data if n not in usual]
    for name in order:
        if split_sizes[name] > 0:
            probe = probes.get(name)
            if probe is None:
                probe = first_batch(name, data[name])
            forward = fields["forward"].select(tuple(probe))
            # The loss's fields too, where the split has them: an unbatched
            # source (per-sample fields of unrelated lengths) is caught here,
            # not at the first padded forward.
            loss = fields["loss"]
            labels = (
                () if loss.takes_all else tuple(f for f in loss.required if f in probe)
            )
            eval_width = batch_size(probe, dict.fromkeys(forward + labels))
            probes["eval"] = probe
            break
    first = probes.get("train", probes.get("eval"))
    if first is not None:  # what a sample looked like, to explain a mismatch
        sample_shapes = {k: tuple(np.shape(v))[1:] for k, v in first.items()}
        sample_dtypes = {k: _dtype_name(v) for k, v in first.items()}
    routing = Routing(
        fields=fields,
        train_fields=train_fields,
        gradient_fields=gradient_fields,
        train_batch=train_batch,
        sample_shapes=sample_shapes,
        residency=residency,
        sample_dtypes=sample_dtypes,
    )
    return routing, eval_width


def _dtype_name(value: Any) -> str:
    """A batch field's dtype by name, read without copying a device array."""
    dtype = getattr(value, "dtype", None)
    return str(dtype if dtype is not None else np.asarray(value).dtype)


def _probe_eval_splits(
    fields: Mapping[str, HookFields],
    data: Mapping[str, Any],
    probes: dict[str, Any],
) -> None:
    """Read the first batch of every split but train and check it: a batch of
    size 0, and the fields the eval hooks need. `val` must carry what validation
    runs (forward, and metrics, or the loss where metrics are not defined); any
    other split what forward takes, since it may serve predict only."""
    forward = fields["forward"]
    if "metrics" in fields:
        validation = (forward, fields["metrics"])
    else:
        validation = (forward, fields["loss"])
    for name in data:
        if name == "train":
            continue
        probe = probes.get(name)
        if probe is None:
            probe = first_batch(name, data[name])
            probes[name] = probe
        hooks = validation if name == "val" else (forward,)
        check_eval_fields(name, probe, hooks)
        check_probe_size(name, batch_size(probe, forward.select(tuple(probe))))


def _residency(experiment: Any, hook: str) -> str:
    """Where metric hook `hook` runs, resolved once at setup."""
    where = hook_function(type(experiment), "metrics_residency")(experiment, hook)
    if where not in ("host", "device"):
        raise ConfigError(
            f'metrics_residency({hook!r}) must return "host" or "device", '
            f"got {where!r}."
        )
    return str(where)


def _route_training(
    fields: dict[str, HookFields], residency: dict[str, str], keys: tuple[str, ...]
) -> GradientFields:
    """What each traced training hook receives of a train batch with `keys`."""
    device_tm = residency.get("train_metrics") == "device"
    return GradientFields(
        forward=fields["forward"].select(keys),
        loss=fields["loss"].select(keys),
        train_metrics=fields["train_metrics"].select(keys) if device_tm else None,
        host_outputs="train_metrics" in fields and not device_tm,
    )


def run_mesh(
    config: RunConfig,
    dist: Any,
    sizes: Mapping[str, int],
    routing: Routing,
    eval_width: int | None,
) -> tuple[Placement | None, int | None]:
    """The run's mesh (None for one device), once the probe knows the batch: the
    global train batch must split evenly, and the eval width is rounded up so a
    padded eval batch does too."""
    n_devs, world = config.n_devs, world_size(dist)
    if n_devs == 1 and world == 1:
        return None, eval_width
    if routing.train_batch is not None:
        check_process_batch_divides(routing.train_batch, n_devs, world)
    if world > 1:  # a process feeding less than the others would hang them
        agree_across_processes(
            {
                "train batches": sizes.get("train", 0),
                "samples per train batch": routing.train_batch or 0,
                # Each process pads its eval chunks to its part of one width.
                "samples in the first eval batch": eval_width or 0,
                **{
                    f"{name} batches": size
                    for name, size in sizes.items()
                    if name != "train"
                },
            }
        )
    if eval_width is not None:  # each process pads its part of the width
        eval_width = padded_width(eval_width, n_devs) * world
    return Placement.build(n_devs=n_devs, mode=config.sharding), eval_width
