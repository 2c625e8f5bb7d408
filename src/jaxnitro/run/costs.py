"""`cost_report`: each compiled program's cost by XLA's analysis, against the clock.

XLA estimates, per call of a compiled program, the floating-point operations it
performs and the bytes it moves (`Compiled.cost_analysis()`). Against the measured
mean time of an optimizer step (the last epoch trained, its stepping only), that
gives the rates the step achieved: FLOP/s and bytes/s, samples a second, and the
model FLOPs utilisation (MFU) against the device's bf16 dense peak where the device
is on record (`devices/peaks.py`; otherwise MFU is reported unknown). On a mesh the
figures are per device. On CPU the analysis is XLA's estimate for the host backend;
an op XLA cannot cost (a custom call) counts as zero.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, TextIO

import jax

from ..compile.costs import program_costs
from ..observe.speed import device_peak, epoch_speed

if TYPE_CHECKING:
    from ..loop.prepared import Prepared
    from .config import RunConfig
    from .view import RunView

# The train programs: one optimizer step a call (or a loop of them, costed once).
STEP_PROGRAMS = ("train_step", "manual_step")
ACCUM_NO_RATES = (
    "step rates: not estimated under accumulation (XLA's analysis costs the train "
    "program's loop over micro-batches once, not accum times); rerun with accum=1 "
    "for the per-step rates."
)


def cost_rows(nitro: RunView) -> list[dict[str, Any]]:
    """One row per compiled program of the handle: kind, flops, bytes."""
    rows = []
    for kind, executable in nitro.executables.compiled():
        flops, moved = program_costs(executable)
        rows.append({"program": kind, "flops": flops, "bytes": moved})
    return rows


def step_costs(rows: list[dict[str, Any]], accum: int) -> tuple[float, float] | None:
    """The flops and bytes of one optimizer step, per device: the last train
    program's (XLA costs its loop over steps once: one step, whatever the steps per
    call); None when none is compiled, under accumulation (XLA costs the scan over
    micro-batches once), or when XLA gives no figure."""
    steps = [row for row in rows if row["program"] in STEP_PROGRAMS]
    if not steps or accum > 1:
        return None
    row = steps[-1]
    if row["flops"] is None or row["bytes"] is None:
        return None
    return row["flops"], row["bytes"]


def si_text(value: float | None, unit: str) -> str:
    """`value` with an SI prefix and `unit` ("1.2 MFLOP"); "n/a" for None."""
    if value is None:
        return "n/a"
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def cost_report(nitro: RunView, file: TextIO | None = None) -> list[dict[str, Any]]:
    """Print each compiled program's cost and the step's achieved rates; return rows.

    See `Nitro.cost_report`.
    """
    rows = cost_rows(nitro)
    out = sys.stdout if file is None else file
    if not rows:
        print(
            "cost report: no program compiled yet; train, validate or predict first.",
            file=out,
        )
        return rows
    width = max(len(row["program"]) for row in rows)
    print(f"{'program':<{width}}  {'flops/call':>12}  {'bytes/call':>12}", file=out)
    for row in rows:
        print(
            f"{row['program']:<{width}}  {si_text(row['flops'], 'FLOP'):>12}  "
            f"{si_text(row['bytes'], 'B'):>12}",
            file=out,
        )
    seconds = nitro.status.step_seconds
    per_step = step_costs(rows, nitro.config.accum)
    if per_step is None and nitro.config.accum > 1:
        print(ACCUM_NO_RATES, file=out)
        return rows
    if seconds is None or per_step is None:
        print("step time: not measured yet (train an epoch first).", file=out)
        return rows
    flops, moved = per_step
    print(
        f"optimizer step: {seconds * 1e3:.3g} ms measured (last epoch), "
        f"{si_text(flops, 'FLOP')}, {si_text(moved, 'B')} by XLA's analysis "
        f"(per device): {si_text(flops / seconds, 'FLOP/s')}, "
        f"{si_text(moved / seconds, 'B/s')} achieved.",
        file=out,
    )
    device = jax.devices()[0]
    peak = device_peak(device)
    speed = epoch_speed(
        seconds, samples_per_step(nitro.prepared, nitro.config), flops, peak
    )
    if "mfu" in speed:
        utilisation = (
            f"MFU {speed['mfu']:.1%} of the {device.device_kind}'s "
            f"{si_text(peak, 'FLOP/s')} bf16 dense peak"
        )
    else:
        utilisation = (
            f"MFU unknown: no peak on record for device kind {device.device_kind!r}"
        )
    print(f"{speed['samples_per_sec']:.4g} samples/s; {utilisation}.", file=out)
    rows.append(
        {
            "program": "optimizer step",
            "flops": flops,
            "bytes": moved,
            "seconds": seconds,
            "flops_per_second": flops / seconds,
            "bytes_per_second": moved / seconds,
            **speed,
        }
    )
    return rows


def samples_per_step(prepared: Prepared, config: RunConfig) -> int:
    """The samples one optimizer step trains on: the global batch, every
    micro-batch of it."""
    batch = prepared.routing.train_batch or 0
    return config.accumulation.samples(batch) * jax.process_count()
