"""Reading a `jax.profiler` trace back: how busy the device was, and its time by part
of a model, told apart by the named scopes its ops were traced under.

`device_trace.py` and `gpt2.py --profile` read their traces with these. A TPU's
trace has a device plane (`/device:TPU:0`) whose `XLA Modules` line holds the
programs and `XLA Ops` line the ops; a CPU backend's has none, and says so.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

PARTS = ("optimizer", "loss", "head", "attention", "mlp")
"""The named scopes `gpt` and the optimizer trace their ops under
(`nn_modules.Attention`: "attention", `FeedForward`: "mlp", the GPT's head: "head",
`nn_xent.token_cross_entropy`: "loss", `OptimizerPlan.apply`: "optimizer"), in the
order an op is matched against them; an op under none is "other" (the embeddings,
the norms, the residual adds, the step's own bookkeeping)."""


def merged_ns(spans: Iterable[tuple[int, int]]) -> int:
    """Nanoseconds covered by `(start, end)` spans, overlaps counted once.

    >>> merged_ns([(0, 10), (5, 15), (20, 25)])
    20
    """
    total, reach = 0, None
    for start, end in sorted(spans):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def part_of(name: str, texts: Iterable[str]) -> str:
    """The part of PARTS an op belongs to: the first whose name stands as a word in
    the op's name or in a text the trace keeps of it (its source's name stack), the
    names of jitted functions aside (`jit(loss)` names a function, not a scope),
    else "other".

    >>> part_of("fusion.12", ["jit(loss)/transpose(jvp(attention))/dot_general"])
    'attention'
    >>> part_of("copy.3", ["jit(loss)/jvp()/add"])
    'other'
    """
    joined = re.sub(r"\bp?jit\([^()]*\)", "", " ".join([name, *texts]))
    for part in PARTS:
        if re.search(rf"\b{part}\b", joined):
            return part
    return "other"


def _texts(event: Any) -> list[str]:
    """The string values among an event's stats (a TPU op's keep its name stack)."""
    return [str(value) for _, value in event.stats if isinstance(value, str)]


def device_parts(path: str, wall: float, steps: int) -> list[str]:
    """The trace at `path` (of `steps` steps over `wall` seconds) as report lines:
    each device plane's busy time, its ops' time by part and the rest of the wall
    (the device waiting for the host)."""
    from jax.profiler import ProfileData

    data = ProfileData.from_file(path)
    out: list[str] = []
    for plane in data.planes:
        if not plane.name.startswith("/device:"):
            continue
        lines = {line.name: list(line.events) for line in plane.lines}
        busy = merged_ns((e.start_ns, e.end_ns) for e in lines.get("XLA Modules", []))
        per_step = 1e3 * steps  # nanoseconds -> microseconds a step
        idle = wall * 1e9 - busy
        out.append(
            f"    {plane.name}: programs busy {busy / per_step:.1f} us a step "
            f"({busy / 1e9 / wall:.1%} of the wall); waiting for the host "
            f"{max(idle, 0) / per_step:.1f} us a step"
        )
        parts: dict[str, int] = defaultdict(int)
        for event in lines.get("XLA Ops", []):
            parts[part_of(event.name, _texts(event))] += event.duration_ns
        total = sum(parts.values()) or 1
        for part in (*PARTS, "other"):
            out.append(
                f"      {part:10s} {parts[part] / per_step:10.1f} us a step "
                f"{parts[part] / total:6.1%} of the ops' time"
            )
    if not out:
        out.append("    no device plane in this backend's trace: no time by part")
    return out
