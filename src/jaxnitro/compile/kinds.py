"""The program kinds a run compiles, each declared once (`declaration.Program`).

A declaration names everything a program is: its arguments (a NamedTuple beside its
builder), its builder, the hooks it traces, its baked constants, what it donates and
where its arguments go on a mesh, by field name. A run specializes the train
declarations with its own constants (`Program.running`: the routed fields, the
optimizer's constants, the steps per call); the eval ones bake nothing of a run.

| kind         | arguments         | builder           | donates                 |
| train_step   | `TrainCallArgs`   | `scanned_fn`      | weights, accumulator    |
| manual_step  | `TrainCallArgs`   | `scanned_fn`      | weights, accumulator    |
| eval_forward | `EvalForwardArgs` | `eval_forward_fn` | nothing                 |
| eval_metrics | `EvalMetricsArgs` | `eval_metrics_fn` | nothing                 |
| eval_loss    | `EvalLossArgs`    | `eval_loss_fn`    | nothing                 |
"""

from __future__ import annotations

from .declaration import REPLICATED, Layout, Like, Program
from .programs import (
    EvalForwardArgs,
    EvalLossArgs,
    EvalMetricsArgs,
    eval_forward_fn,
    eval_loss_fn,
    eval_metrics_fn,
)
from .scanned import TrainCallArgs, scanned_fn


def train_layout(accum: int) -> Layout:
    """The train program's layout: the state as the run's `Placement` lays it out
    (and back where it went in), its block split along the batch axis behind the
    block's leading axes (and the micro-batch axis under accumulation), the rest
    replicated."""
    return Layout(
        inputs={
            "weights": "state",
            "accumulator": "state",
            "block": "block" if accum == 1 else "accum_block",
        },
        outputs=(
            Like("weights"),
            "replicated",
            Like("accumulator"),
            "replicated",
            "replicated",
        ),
    )


TRAIN_STEP = Program(
    "train_step",
    TrainCallArgs,
    scanned_fn,
    traced=("forward", "loss"),  # and train_metrics where it runs on the device
    baked={"mode": "train_calls"},
    donate=("weights", "accumulator"),
    layout=train_layout(1),
)
"""The automatic train program: one to K optimizer steps a call."""

MANUAL_STEP = Program(
    "manual_step",
    TrainCallArgs,
    scanned_fn,
    traced=("train_step",),
    baked={"mode": "train_calls"},
    donate=("weights", "accumulator"),
    layout=train_layout(1),
    announce_as="train_step",
)
"""The train program around the experiment's own `train_step` (manual mode)."""

EVAL_FORWARD = Program(
    "eval_forward",
    EvalForwardArgs,
    eval_forward_fn,
    traced=("forward",),
    baked={"mode": "eval"},
    layout=Layout(inputs={"params": "state", "batch": "batch"}),
)
"""forward in eval mode on a batch padded to the eval width."""

EVAL_METRICS = Program(
    "eval_metrics",
    EvalMetricsArgs,
    eval_metrics_fn,
    traced=("metrics",),
    baked={"mode": "eval"},
    layout=REPLICATED,
)
"""Device-resident metrics on (sliced) eval outputs."""

EVAL_LOSS = Program(
    "eval_loss",
    EvalLossArgs,
    eval_loss_fn,
    traced=("loss",),
    baked={"mode": "eval"},
    layout=REPLICATED,
)
"""The loss on (sliced) eval outputs."""
