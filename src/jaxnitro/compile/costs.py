"""What XLA's cost analysis says one call of a compiled program costs.

`Compiled.cost_analysis()` estimates the floating-point operations a call performs
and the bytes it moves. On a mesh the estimate is per device (the partitioned
program each device runs). A loop inside the program (the train program's loop over
the steps of a call, the scan over micro-batches) is costed once: the train
program's figure is one optimizer step's at accum 1, whatever the steps per call.
An op XLA cannot cost (a custom call, a Pallas kernel) counts as zero.
"""

from __future__ import annotations

from typing import Any

_FLOPS: dict[int, tuple[Any, float | None]] = {}
"""Each train program's step FLOPs, by id, the program held so the id stays its own
(an analysis walks the whole module: once per program, not once per epoch)."""


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


def step_flops(program: Any, accum: int) -> float | None:
    """The FLOPs of one optimizer step of the train `program`, per device; None
    under accumulation (XLA costs the scan over micro-batches once, not accum
    times) or where XLA gives no figure."""
    if program is None or accum > 1:
        return None
    held = _FLOPS.get(id(program))
    if held is not None and held[0] is program:
        return held[1]
    if len(_FLOPS) > 16:
        _FLOPS.clear()
    flops = program_costs(program)[0]
    _FLOPS[id(program)] = (program, flops)
    return flops
