"""How many optimizer steps a call runs: the keyword's count, or what
steps_per_call="auto" chooses from the measured step time (once per train-program
family in a process: a later handle of it starts at the count chosen)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import TYPE_CHECKING

import jax

from ..compile.programs import model_key
from ..keys.program_key import typed_key

if TYPE_CHECKING:
    from .prepared import Prepared

AUTO_CALL_SECONDS = 8e-3
"""steps_per_call="auto" makes a call about this long: long enough that what a call
costs the host beside its steps (on a TPU host its launch, its block's stack and
transfer and its Python: 0.3-0.6 ms) is a small part, short enough that a stop
request waits little."""
AUTO_MOST = 16
"""The most steps "auto" puts in one call (a stop request waits for the call)."""


def steps_per_call(
    setting: int | str, step_seconds: float | None, epoch_steps: int | None = None
) -> int:
    """The steps per call of the epoch about to run, for the keyword's `setting`.

    The keyword's count, or for "auto": 1 while nothing was measured
    (`step_seconds` None), else the largest power of two up to `AUTO_MOST` whose
    call takes at most `AUTO_CALL_SECONDS` at that step time and, given the
    epoch's `epoch_steps`, that leaves the epoch at least two calls (a handle
    measures its first epoch at 1 and keeps the count chosen from it, unless its
    train program's family chose one in the process already: `run/training.py`).
    Every count trains the same steps bit for bit, so the choice changes the speed
    only. "auto" is 1 across processes: each process would measure its own step
    time, and every rank must run the same calls.

    Why two calls: an epoch of one call leaves the device idle while the host
    stacks its only block, copies it and, after the call, closes the epoch; with
    two, the second block's stack and copy overlap the first call. On a TPU v5e
    the compute-bound MLP's 12-step epoch (800 KB batches) trained 1.27x the
    hand-written loop at 8 steps a call (calls of 8 and 4) and 0.95x as one call.

    >>> [steps_per_call("auto", s) for s in (None, 1e-3, 450e-6, 10e-3)]
    [1, 8, 16, 1]
    >>> [steps_per_call("auto", 1e-4, n) for n in (12, 16, 17, 2, 1)]
    [8, 8, 16, 1, 1]
    >>> steps_per_call(3, 1e-6)
    3
    """
    if setting != "auto":
        return int(setting)
    if jax.process_count() > 1:
        return 1
    seconds = step_seconds
    if not seconds:
        return 1
    fits = min(AUTO_MOST, max(1, int(AUTO_CALL_SECONDS / seconds)))
    if epoch_steps is not None:  # below the epoch: at least two calls
        fits = min(fits, max(1, epoch_steps - 1))
    return 1 << (fits.bit_length() - 1)


AUTO_REMEMBERED = 256
"""The most train-program families whose count a process remembers (the least
recently used forgotten first)."""
_AUTO_CHOSEN: OrderedDict[Hashable, tuple[int, bool]] = OrderedDict()
"""steps_per_call="auto"'s count per train-program family (`train_family`), and
whether a handle has run an epoch at it (its program compiled)."""
_AUTO_LOCK = threading.Lock()  # the agent server trains handles on threads


def train_family(prepared: Prepared, accum: int, epoch_steps: int) -> Hashable:
    """What two handles' train programs share when they differ at most in the
    steps a call runs: what the compile cache keys a program by (the experiment's
    class, its GraphConst values, its hooks' code, the model, the optimizer's
    constants, the routed batch's shapes and dtypes, the precision, the mesh, the
    compile options; `compile.programs.TraceContext.key`) but the block's step
    axis, and the epoch's steps, which bound the count. A coarser family than a
    program costs at most speed: every count trains the same steps."""
    ctx, plan, routing = prepared.ctx, prepared.plan, prepared.routing
    return (
        (ctx.cls.__module__, ctx.cls.__qualname__),
        typed_key(ctx.graphconst),
        typed_key(dict(prepared.hook_prints)),
        model_key(ctx.model),
        None if plan is None else typed_key(plan.constants()),
        None if plan is None else typed_key(plan.gradient_constants()),
        routing.train_batch,
        typed_key(dict(routing.sample_shapes)),
        typed_key(dict(routing.sample_dtypes)),
        prepared.manual,
        accum,
        ctx.precision,
        typed_key(ctx.compile_options),
        None if ctx.placement is None else ctx.placement.key(),
        epoch_steps,
    )


def remembered_steps_per_call(family: Hashable) -> int | None:
    """The count "auto" chose in this process for a train program of `family`,
    once a handle has run an epoch at it: a later handle of the family (a sweep's
    next trial, a rerun in a notebook) runs that count from its first epoch, its
    program compiled already, where it would have timed a first epoch of one step
    a call again. None before (a first epoch at one step a call compiles nothing
    more than the first handle did)."""
    with _AUTO_LOCK:
        held = _AUTO_CHOSEN.get(family)
        if held is None or not held[1]:
            return None
        _AUTO_CHOSEN.move_to_end(family)
        return held[0]


def auto_steps_per_call(family: Hashable, step_seconds: float, epoch_steps: int) -> int:
    """`steps_per_call("auto", step_seconds, epoch_steps)`, chosen once per train
    program `family` in the process: a later handle of it takes the same count, so
    it compiles nothing more (its own step time could fall on the other side of a
    power of two)."""
    with _AUTO_LOCK:
        held = _AUTO_CHOSEN.get(family)
    if held is not None:
        return held[0]
    chosen = steps_per_call("auto", step_seconds, epoch_steps)
    with _AUTO_LOCK:
        chosen = _AUTO_CHOSEN.setdefault(family, (chosen, False))[0]
        while len(_AUTO_CHOSEN) > AUTO_REMEMBERED:
            _AUTO_CHOSEN.popitem(last=False)
    return chosen


def ran_steps_per_call(family: Hashable, count: int) -> None:
    """A handle of `family` ran an epoch at "auto"'s `count`: later handles of the
    family start at it (`remembered_steps_per_call`)."""
    with _AUTO_LOCK:
        held = _AUTO_CHOSEN.get(family)
        if held is not None and held[0] == count and not held[1]:
            _AUTO_CHOSEN[family] = (count, True)
