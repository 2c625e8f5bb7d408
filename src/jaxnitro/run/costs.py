"""`cost_report`: each compiled program's cost by XLA's analysis, against the clock.

XLA estimates, per call of a compiled program, the floating-point operations it
performs and the bytes it moves (`Compiled.cost_analysis()`). Against the measured
mean time of an optimizer step (the last epoch trained, its stepping only), that
gives the rates the step achieved: FLOP/s and bytes/s, to compare with the device's
peak. On CPU the analysis is XLA's estimate for the host backend; an op XLA cannot
cost (a custom call) counts as zero.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from .handle import Nitro

# The programs one optimizer step runs, by how the run trains.
STEP_PROGRAMS = ("train_step", "gradient", "optimizer")
ACCUM_NO_RATES = (
    "step rates: not estimated under accumulation (XLA's analysis costs the train "
    "program's loop over micro-batches once, not accum times); rerun with accum=1 "
    "for the per-step rates."
)


def program_costs(executable: Any) -> tuple[float | None, float | None]:
    """`(flops, bytes accessed)` of one call, or None where XLA gives no figure."""
    try:
        analysis = executable.cost_analysis()
    except Exception:  # a backend without cost analysis
        return None, None
    if isinstance(analysis, list | tuple):  # older JAX: one dict per device
        analysis = analysis[0] if analysis else {}
    if not isinstance(analysis, dict):
        return None, None
    flops = analysis.get("flops")
    moved = analysis.get("bytes accessed")
    return (
        None if flops is None else float(flops),
        None if moved is None else float(moved),
    )


def cost_rows(nitro: Nitro) -> list[dict[str, Any]]:
    """One row per compiled program of the handle: kind, flops, bytes."""
    rows = []
    for kind, executable in nitro.executables.compiled():
        flops, moved = program_costs(executable)
        rows.append({"program": kind, "flops": flops, "bytes": moved})
    return rows


def step_costs(rows: list[dict[str, Any]], accum: int) -> tuple[float, float] | None:
    """The flops and bytes of one optimizer step: the train program (XLA costs its
    loop over steps once: one step, whatever the steps per call), or on a mesh
    `accum` gradient calls plus one optimizer call; None when a program is not
    compiled or the step's cost is not known (the train program under
    accumulation)."""
    by_kind = {row["program"]: row for row in rows}
    if "train_step" in by_kind:
        if accum > 1:
            return None
        parts = [(by_kind["train_step"], 1)]
    elif "gradient" in by_kind and "optimizer" in by_kind:
        parts = [(by_kind["gradient"], accum), (by_kind["optimizer"], 1)]
    else:
        return None
    if any(row["flops"] is None or row["bytes"] is None for row, _ in parts):
        return None
    flops = sum(row["flops"] * n for row, n in parts)
    moved = sum(row["bytes"] * n for row, n in parts)
    return flops, moved


def si_text(value: float | None, unit: str) -> str:
    """`value` with an SI prefix and `unit` ("1.2 MFLOP"); "n/a" for None."""
    if value is None:
        return "n/a"
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def cost_report(nitro: Nitro, file: TextIO | None = None) -> list[dict[str, Any]]:
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
        f"{si_text(flops, 'FLOP')}, {si_text(moved, 'B')} by XLA's analysis: "
        f"{si_text(flops / seconds, 'FLOP/s')}, "
        f"{si_text(moved / seconds, 'B/s')} achieved.",
        file=out,
    )
    rows.append(
        {
            "program": "optimizer step",
            "flops": flops,
            "bytes": moved,
            "seconds": seconds,
            "flops_per_second": flops / seconds,
            "bytes_per_second": moved / seconds,
        }
    )
    return rows
