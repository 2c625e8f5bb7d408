"""The host side of one training epoch: read-backs, the divergence check, train lines.

The hot loop (`calls.py`) dispatches calls of one to K steps and settles what they
reported a call or more later: a call that carries only losses in one pass
(`EpochLog.settle_losses`), any other micro-batch by micro-batch as an `InFlight`
(`EpochLog.settle`), which checks the loss, keeps the epoch's running mean and
writes the train line of every `log_every_n_steps`-th step; at the epoch's end the
loop writes its train summary line (`EpochLog.log_summary`, context "train_epoch"),
whatever the cadence: the epoch's mean loss and the mean of each train_metrics value
over its steps (`TrainMeans`). A scanned call reports its steps' loss terms and device
train_metrics stacked: each micro-batch's share is a `Stacked` reference into them,
sliced only once the logger has read the line's values back.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from ..data.finite import describe_nonfinite, nonfinite_fields
from ..errors import DivergenceError
from ..logging import protocol as logproto
from ..logging.deferred import DeferredMetrics

SUMMARY_CONTEXT = "train_epoch"
"""The context of the line every epoch (or part-epoch a stop cut) ends with."""
FOLD_EVERY = 64
"""The most settled calls (steps, for train_metrics computed on the host) whose
train_metrics `TrainMeans` holds unsummed: each time it holds this many, one small
program adds the calls' stacked device values into a running device sum (host
values are summed on the host). So the hot loop gains no read-back and no dispatch
per call, and the memory held stays bounded."""

if TYPE_CHECKING:
    from .context import EpochContext


class Stacked(NamedTuple):
    """One micro-batch's share of a scanned call's stacked outputs.

    Attributes:
        tree: the call's outputs (loss terms or device train_metrics), each leaf
            stacked `(steps, ...)` or `(steps, accum, ...)`; on the device until the
            logger reads the line back, NumPy after.
        at: the micro-batch's index into the leading axes, `(step,)` or
            `(step, micro)`.
    """

    tree: Any
    at: tuple[int, ...]


def unstacked(value: Any) -> Any:
    """`value` itself, or the micro-batch's slice of a `Stacked` one (read back)."""
    if isinstance(value, Stacked):
        return sliced(value.tree, value.at)
    return value


def sliced(tree: Any, at: tuple[int, ...]) -> Any:
    """Every leaf of `tree` at index `at` of its leading axes."""
    return jax.tree.map(lambda leaf: leaf[at], tree)


@dataclass(slots=True)  # one built per micro-batch: slots make that cheaper
class InFlight:
    """A dispatched micro-batch whose loss has not been read back yet."""

    loss: Any
    terms: Any
    stats: Any
    outputs: Any
    host_batch: Mapping[str, Any]
    step: int
    index: int
    ends_step: bool
    schedule_line: dict[str, float] | None


class EpochLog:
    """The host side of one epoch: read-backs, the divergence check, train lines.

    The epoch's mean loss is a running sum over its micro-batches, in order; a stop
    partway through hands it on (`carried`), so the continued epoch's mean is the
    whole epoch's, bitwise the same as a run never stopped.
    """

    def __init__(
        self,
        context: EpochContext,
        epoch: int,
        carried: tuple[float, int] = (0.0, 0),
        skip: int = 0,
    ) -> None:
        self.context = context
        self.epoch = epoch
        self.loss_sum, self.loss_count = carried
        self.trained = skip
        """Batches of the epoch trained so far, those a stopped run trained included."""
        self.step_losses: list[float] = []
        self.step_terms: list[Any] = []  # each micro-batch's loss terms, on the device
        self.means = TrainMeans()
        """The train_metrics of the epoch's optimizer steps, for the summary line
        (gathered only while a logger is on)."""
        self.check = context.check_divergence
        self.every = context.log_every_n_steps
        self.logging = context.logger is not None
        self.feed: Any = None  # the epoch's batches, for the time spent waiting
        self.program: Any = None  # the train program the epoch ran, for its cost
        self.steady_step_seconds: float | None = None
        """Wall seconds an optimizer step took after the epoch's first call (which
        may compile or load its program) until the last loss was read, mid-epoch
        events left out: what steps_per_call="auto" chooses from. None when the
        epoch ran one call."""
        self.progress = context.bar  # shows the latest train loss
        self.latest: float | None = None
        """The last settled micro-batch's loss."""

    def settle(self, item: InFlight) -> None:
        loss = float(item.loss)
        if self.check and not math.isfinite(loss):
            raise DivergenceError(divergence_message(loss, item, self.epoch))
        self.loss_sum += loss
        self.loss_count += 1
        self.latest = loss
        self.trained += 1
        self.step_losses.append(loss)
        if item.terms:
            self.step_terms.append(item.terms)
        if item.outputs is not None:  # train_metrics on the host: every micro-batch
            item.stats = self._host_train_metrics(item)
            item.outputs = None
        if not item.ends_step:
            return
        if self.logging:
            stats = item.stats
            if stats and not isinstance(stats, Stacked):  # a call's: `add_call`
                self.means.add(stats)
            if item.step % self.every == 0:
                self._log_line(item)
        self.step_losses = []
        self.step_terms = []

    def settle_losses(self, losses: list[float]) -> bool:
        """Settle micro-batches that make whole optimizer steps and carry nothing
        but their loss (no loss terms, no train_metrics, no train line among their
        steps), in order, as `settle` would one by one: the same running sum, so
        the epoch's mean is bitwise the same. False, settling none, when the
        divergence check is on and one is not finite: `settle` them one by one
        then, which names the step."""
        if not losses:
            return True
        if self.check and not all(map(math.isfinite, losses)):
            return False
        total = self.loss_sum
        for loss in losses:  # one by one: a sum in another order could round apart
            total += loss
        self.loss_sum = total
        self.loss_count += len(losses)
        self.trained += len(losses)
        self.latest = losses[-1]
        return True

    def show_latest(self) -> None:
        """Show the last settled loss on the progress line (throttled)."""
        if self.progress is not None and self.latest is not None:
            self.progress.show({"loss": self.latest}, throttle=True)

    def _log_line(self, item: InFlight) -> None:
        # The loss terms and device train_metrics stay on the device: the logger
        # reads them back later, with the other lines it holds (logging/deferred.py).
        loss = sum(self.step_losses) / len(self.step_losses)
        line = DeferredMetrics(
            (self.step_terms, item.stats),
            functools.partial(_train_line, loss, item.schedule_line),
        )
        logproto.log_deferred(
            self.context.logger, line, step=item.step, epoch=self.epoch, context="train"
        )

    def _host_train_metrics(self, item: InFlight) -> Any:
        prepared = self.context.prepared
        names = prepared.routing.fields["train_metrics"].select(tuple(item.host_batch))
        return prepared.hooks["train_metrics"](
            self.context.experiment,
            jax.device_get(item.outputs),
            **{k: item.host_batch[k] for k in names},
        )

    def log_summary(self, step: int) -> None:
        """Write the epoch's train summary line at `step`, its last optimizer step.

        It carries `loss`, the epoch's mean train loss (`mean_loss`, the history
        row's `train_loss`; a continued epoch's mean includes the batches trained
        before the stop), and each train_metrics value averaged over the epoch's
        optimizer steps: the mean of the values its steps' train lines would carry
        (each step's last micro-batch's). Those cover the steps this process
        trained in the epoch: a continued epoch's, only the steps after the resume
        (the checkpoint record carries the loss sum alone). Written whatever
        `log_every_n_steps` is, so a run shorter than the cadence still logs its
        training; the sums are read back now, once an epoch.
        """
        if not self.logging or not self.loss_count:
            return
        logproto.log_metrics(
            self.context.logger,
            _summary_line(self.mean_loss(), self.means.means()),
            step=step,
            epoch=self.epoch,
            context=SUMMARY_CONTEXT,
        )

    def mean_loss(self) -> float:
        """The epoch's mean train loss (NaN if it ran no micro-batch)."""
        return self.loss_sum / self.loss_count if self.loss_count else math.nan

    def carried(self) -> tuple[float, int]:
        """The running loss sum and count, for the rest of an epoch a stop cut."""
        return self.loss_sum, self.loss_count


class TrainMeans:
    """The mean of each train_metrics value over an epoch's optimizer steps.

    Each step counts with the values its train line carries (its last
    micro-batch's). `add_call` takes a scanned call's stacked device values once
    the call is settled, held by reference with the steps it trained (a call cut
    short leaves the rows past its length unused): every `FOLD_EVERY` calls one
    program sums the held calls' rows into a running device sum (float32 at least),
    read back by `means` at the epoch's end. `add` takes a step's own values
    (train_metrics computed on the host): summed on the host in float64,
    `FOLD_EVERY` steps at a time. A value that is not a number keeps its last
    step's value.
    """

    def __init__(self) -> None:
        self.stacked: list[tuple[Any, int]] = []  # each call's (tree, steps)
        self.micro: int | None = None  # a step's last micro-batch, under accum
        self.steps: list[Any] = []  # each step's values, unread
        self.folded: Any = None  # the device sums of the calls folded so far
        self.folded_steps = 0
        self.sums: dict[str, Any] = {}  # host sums, float64
        self.counts: dict[str, int] = {}
        self.last: dict[str, Any] = {}  # values that are not numbers

    def add_call(self, stats: Any, steps: int, accum: int) -> None:
        """Hold a settled call's train_metrics, stacked `(K, ...)` (or `(K, accum,
        ...)`) on the device, of which it trained the first `steps` rows."""
        if len(self.stacked) >= FOLD_EVERY:
            self._fold()
        self.stacked.append((stats, steps))
        self.micro = accum - 1 if accum > 1 else None

    def add(self, stats: Any) -> None:
        """Hold one optimizer step's own train_metrics (its last micro-batch's)."""
        self.steps.append(stats)
        if len(self.steps) >= FOLD_EVERY:
            self._read_steps()

    def means(self) -> dict[str, Any]:
        """Each value's mean over the steps added (one read-back of the sums)."""
        if self.stacked:
            self._fold()
        if self.steps:
            self._read_steps()
        if self.folded is not None:
            self._sum(jax.device_get(self.folded), self.folded_steps)
            self.folded, self.folded_steps = None, 0
        out = {name: total / self.counts[name] for name, total in self.sums.items()}
        return out | self.last

    def _fold(self) -> None:
        held, self.stacked = self.stacked, []
        # A power of two of calls a program, the last call repeated with no rows:
        # a few programs serve every count.
        width = 1 << (len(held) - 1).bit_length()
        trees = tuple(dict(tree) for tree, _ in held)
        trees += (trees[-1],) * (width - len(held))
        rows = np.zeros(width, np.int32)
        rows[: len(held)] = [steps for _, steps in held]
        self.folded = _fold_calls(self.folded, trees, rows, self.micro)
        self.folded_steps += int(rows.sum())

    def _read_steps(self) -> None:
        values, self.steps = jax.device_get(self.steps), []
        for stats in values:
            self._sum(dict(stats), 1)

    def _sum(self, values: dict[str, Any], steps: int) -> None:
        for name, value in values.items():
            array = np.asarray(value)
            if array.dtype.kind not in "biufc":
                self.last[name] = value
                continue
            array = array.astype(np.result_type(array.dtype, np.float64))
            if name in self.sums:
                self.sums[name] = self.sums[name] + array
                self.counts[name] += steps
            else:
                self.sums[name], self.counts[name] = array, steps


@functools.partial(jax.jit, static_argnums=3)
def _fold_calls(
    total: dict[str, Any] | None,
    trees: tuple[dict[str, Any], ...],
    rows: Any,
    micro: int | None,
) -> dict[str, Any]:
    """`total` plus the sum of each call's first `rows[i]` rows of `trees[i]`
    (under accumulation, micro-batch `micro` of each step: its last)."""
    sums = dict(total or {})
    for tree, count in zip(trees, rows, strict=True):
        for name, leaf in tree.items():
            values = leaf if micro is None else leaf[:, micro]
            kept = jnp.arange(values.shape[0]) < count
            kept = kept.reshape(kept.shape + (1,) * (values.ndim - 1))
            dtype = jnp.promote_types(values.dtype, jnp.float32)
            part = jnp.sum(jnp.where(kept, values.astype(dtype), 0), axis=0)
            sums[name] = sums[name] + part if name in sums else part
    return sums


class StepEvents(Protocol):
    """What the hot loop calls at the steps a step-based run places events on
    (`cadence.StepCadence`): validation, a checkpoint, max_steps."""

    def next_after(self, step: int) -> int:
        """The first step after `step` with an event; `cadence.NEVER` for none."""
        ...

    def fire(self, step: int, log: EpochLog) -> bool:
        """Run the events of `step`, the handle holding the state after it and
        `log` every micro-batch up to it; True: leave the epoch here."""
        ...


def divergence_message(loss: float, item: InFlight, epoch: int) -> str:
    """The divergence error, saying whether the batch's inputs were already
    non-finite: bad data wants fixing, not a lower learning rate. The inputs are
    read only now, so finite batches cost the hot loop nothing."""
    where = (
        f"The training loss is {loss} at step {item.step} of epoch {epoch} (batch "
        f"{item.index} of the epoch)."
    )
    found = nonfinite_fields(item.host_batch)
    if found:
        return (
            f"{where} The batch's inputs were already non-finite "
            f"({describe_nonfinite(found)}): the data, not the optimization, is at "
            f"fault. There is no rollback: fix or filter those samples in the source "
            f"and resume from the last checkpoint."
        )
    return (
        f"{where} The batch's inputs were all finite, so the model diverged. There "
        f"is no rollback: resume from the last checkpoint with a lower learning "
        f"rate, or pass check_divergence=False to continue from the diverged state."
    )


def _train_line(
    loss: float, schedule_line: dict[str, float] | None, fetched: Any
) -> dict[str, Any]:
    """The train line of a step: its mean loss, each loss term averaged over the
    step's micro-batches as the loss is, the train_metrics of its last micro-batch
    (the spec's train line) and the schedule values; `fetched` is `(terms, stats)`
    read back (a scanned call's shares of them `Stacked`)."""
    terms = [unstacked(t) for t in fetched[0]]
    stats = unstacked(fetched[1])
    line: dict[str, Any] = {"loss": loss}
    for name in terms[0] if terms else ():
        line[f"loss/{name}"] = sum(float(t[name]) for t in terms) / len(terms)
    line.update(_stats_line(stats))
    if schedule_line:
        line.update(schedule_line)
    return line


def _summary_line(loss: float, means: dict[str, Any]) -> dict[str, Any]:
    """The epoch's summary line: its mean loss and its train_metrics' means."""
    return {"loss": loss, **_stats_line(means)}


def _stats_line(stats: Any) -> dict[str, Any]:
    """The train_metrics values of a line, each a host scalar or array."""
    return {str(name): _scalar(value) for name, value in dict(stats or {}).items()}


def _scalar(value: Any) -> Any:
    array = np.asarray(value)
    return array.item() if array.ndim == 0 else array
