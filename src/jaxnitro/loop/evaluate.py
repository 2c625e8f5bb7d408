"""validate, evaluate and predict: forward in eval mode, padding invisible.

All three share one compiled eval forward program per handle (compiled for the eval
batch width), so moving between them compiles nothing. A short batch is padded to the
width, run, and every output leaf is sliced back to the real count before any hook sees
it; a batch wider than the width runs in chunks, joined again so that `metrics` sees
each batch once, whole. A split's pass comes through its eval feed
(`feed.open_eval_feed`): on the prefetch paths a producer thread pads (and on an
accelerator transfers) the next chunk while the current one runs; predict pads on the
calling thread. Metrics run on the host by default (`metrics_residency`), or in their
own small program on the device; the loss, when reported, runs on the device as in
training. NaN or infinite forward outputs are counted beside the forward
(`nonfinite.OutputTally`), read back once with the metrics: a pass that had any
reports the count as `nonfinite_outputs` and warns, and its epoch is unscored.
"""

from __future__ import annotations

import functools
import math
import numbers
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from ..compile.declaration import Program
from ..compile.kinds import EVAL_FORWARD, EVAL_LOSS, EVAL_METRICS
from ..compile.programs import EvalForwardArgs
from ..data.padding import check_batch_first, pad_batch, slice_outputs
from ..data.sources import batch_size, first_batch
from ..data.stream import EvalStaged
from ..devices.gather import chunk_counts, gather_fields, gather_outputs, gather_whole
from ..devices.placement import padded_width
from ..errors import ConfigError, HookError, NitroWarning, RoutingError, user_stacklevel
from ..experiment.routing import as_batch
from ..metrics import MetricAccumulator, flatten_metrics, plain, refuse_unreduced
from ..observe import phases
from ..observe.counter import advance_progress_counter
from ..watch import NONFINITE_OUTPUTS
from .feed import open_eval_feed
from .nonfinite import OutputTally, report_nonfinite_outputs

if TYPE_CHECKING:
    from .context import EvalHost


def _shapes(batch: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(
        (k, np.shape(v), str(getattr(v, "dtype", ""))) for k, v in batch.items()
    )


def _delete(tree: Any) -> None:
    for leaf in jax.tree_util.tree_leaves(tree):
        if isinstance(leaf, jax.Array) and not leaf.is_deleted():
            leaf.delete()


def across_processes() -> bool:
    """Whether the eval programs span several processes' devices (`jax.distributed`)."""
    return jax.process_count() > 1


def process_width(width: int) -> int:
    """Each process's part of the eval `width` (the global batch the programs see)."""
    return width // jax.process_count()


def eval_width_for(size: int, n_devs: int) -> int:
    """The eval width for a first batch of `size` rows (this process's, across
    processes): rounded up to divide by the n_devs devices of every process."""
    return padded_width(size, n_devs) * jax.process_count()


def forward_chunk(
    host: EvalHost, chunk: Mapping[str, Any], names: tuple[str, ...]
) -> tuple[Any, int]:
    """Outputs of forward on one chunk (<= the eval width), sliced back: device
    arrays, or across processes host arrays (every process passes the same chunk
    and gets the whole outputs)."""
    width = host.eval_width
    assert width is not None
    count = batch_size(chunk, names)
    padded = pad_batch({k: chunk[k] for k in names}, width)
    if not across_processes():
        return forward_padded(host, padded, count), count
    spread = forward_padded(host, padded, None)
    whole = gather_whole(spread)
    _delete(spread)
    return jax.tree.map(lambda leaf: leaf[:count], whole), count


def forward_padded(host: EvalHost, padded: Mapping[str, Any], count: int | None) -> Any:
    """Device outputs of forward on fields padded to the eval width, cut to `count`
    (None: left padded, as across processes, where every process's part is)."""
    width = host.eval_width
    assert width is not None
    ctx = host.prepared.ctx
    names = tuple(padded)
    args = EvalForwardArgs(
        host.device_values(), host.eval_params(), host.states, padded
    )
    try:
        executable = EVAL_FORWARD.executable(
            host.executables, ctx, args, _shapes(padded), ctx, names
        )
    except Exception as error:  # a trace for a batch of another shape failed
        note = _shape_note(host, padded)
        if note:
            error.add_note(note)
        raise
    outputs = executable(*args)
    host.executables.check_once(
        ("batch first", width), lambda: check_batch_first(outputs, width)
    )
    if count is not None and count < width:
        full = outputs
        outputs = slice_outputs(full, count)
        jax.block_until_ready(outputs)
        _delete(full)
    return outputs


def _shape_note(host: EvalHost, fields: Mapping[str, Any]) -> str | None:
    """Which fields differ in per-sample shape from the batches the handle was set up
    with, when tracing forward for a new shape failed; None when none does."""
    known = host.prepared.routing.sample_shapes
    shapes = {name: tuple(np.shape(value))[1:] for name, value in fields.items()}
    differ = [
        f"`{name}` has samples of shape {shape}, not {known[name]}"
        for name, shape in shapes.items()
        if name in known and shape != known[name]
    ]
    if not differ:
        return None
    return (
        f"Tracing forward for this batch failed, and its fields differ from the "
        f"batches this handle was set up with: {'; '.join(differ)}. Pass batches "
        f"shaped like the training data (the batch axis first)."
    )


_ON_OUTPUTS: dict[str, Program] = {"eval_metrics": EVAL_METRICS, "eval_loss": EVAL_LOSS}
"""The programs that run a hook on (sliced) eval outputs."""


def run_on_outputs(
    host: EvalHost,
    kind: str,
    outputs: Any,
    chunk: Mapping[str, Any],
    names: tuple[str, ...],
) -> Any:
    """Run `metrics` or `loss` on (sliced) device outputs in their own small program.

    They run on the real sample count, never on padding, so a split with a short
    last batch compiles them once per distinct size. Metrics come back as
    `MetricLeaf`s, their modes restored from the program's output structure.
    """
    ctx = host.prepared.ctx
    fields = {k: np.asarray(chunk[k]) for k in names}
    program = _ON_OUTPUTS[kind]
    args = program.args(host.device_values(), outputs, fields)
    executable = program.executable(
        host.executables,
        ctx,
        args,
        (_shapes(fields), _tree_shapes(outputs)),
        ctx,
        names,
    )
    return jax.device_get(executable(*args))


def _tree_shapes(tree: Any) -> tuple[Any, ...]:
    """A hashable description of a tree's structure and leaf shapes (a dict of
    outputs is no memo key itself)."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return (treedef, tuple(np.shape(leaf) for leaf in leaves))


def _chunks(batch: Mapping[str, Any], names: tuple[str, ...], width: int) -> Any:
    size = batch_size(batch, names)
    if size <= width:
        yield batch
        return
    for start in range(0, size, width):
        yield {k: np.asarray(v)[start : start + width] for k, v in batch.items()}


def evaluate_split(
    host: EvalHost, split: str, *, stoppable: bool = True
) -> dict[str, Any]:
    """Run one split in eval mode and return its finalized metrics.

    The transition out of EvalStepping carries the metrics to the monitors: back to
    TrainStepping during training; otherwise the handle's phase goes back quietly to
    how its run stands (Done, Failed, Starting) and the metrics ride on the entry
    point's Idle. A failure restores the phase too.
    """
    previous = host.phase
    try:
        result = _evaluate_split(host, split, previous, stoppable)
    except BaseException:
        host.restore_phase(previous)
        raise
    _leave_eval(host, previous, metrics=result)
    return result


def _leave_eval(host: EvalHost, previous: phases.Phase, **info: Any) -> None:
    if isinstance(previous, phases.TrainStepping):
        host.set_phase(previous, **info)
    else:
        host.restore_phase(previous, **info)


EMPTY_BATCH = (
    "Batch {index} of split `{split}` holds 0 samples (axis 0 of its fields is 0): "
    "it would score nothing. Drop empty batches in the source."
)


def _evaluate_split(
    host: EvalHost, split: str, previous: phases.Phase, stoppable: bool
) -> dict[str, Any]:
    source = host.data[split]
    bar = _begin_pass(host, split, previous, len(source))
    fields = host.prepared.routing.fields
    has_metrics = "metrics" in host.prepared.hooks
    want_loss = not has_metrics or host.config.eval_loss
    device_metrics = (
        has_metrics and host.prepared.routing.residency.get("metrics") == "device"
    )
    metrics = MetricAccumulator()
    losses = _LossMean()  # its own leaves: a metric can never merge into the loss
    tally = OutputTally()  # the outputs' NaN and inf values, read once at the end
    across = across_processes()
    feed = _open_feed(host, split, source)
    batch = _BatchParts()  # the metrics' inputs of the source batch being run
    inside = False  # whether the last chunk left its source batch unfinished
    index = 0  # the source batch the chunk belongs to
    try:
        for item in feed:
            # A stop ends the pass between source batches, never inside one, so
            # the metrics and the loss both count whole batches.
            stop = stoppable and not inside and host.stops.stop_requested
            if stop and not across:
                break
            if item.n_real == 0 and not across:  # across: refused on every rank
                raise ConfigError(EMPTY_BATCH.format(index=index, split=split))
            if across:  # every process's rows, on every process
                shared = chunk_counts(
                    item.n_real,
                    item.ends_batch,
                    split=split,
                    index=index,
                    width=process_width(host.eval_width or 0),
                    stop=stop,
                )
                if shared.stop:  # one rank's request stops every rank here
                    host.stops.request()
                    break
                item, outputs = _gathered(host, item, shared.counts)
            else:
                outputs = forward_padded(host, item.device, item.n_real)
            chunk, keys = item.host, tuple(item.host)
            feed.release(item.device)  # dispatched: the runtime frees it after use
            tally.add(outputs)  # the real rows only: padding was sliced off
            if has_metrics:
                names = fields["metrics"].select(keys)
                batch.add(
                    outputs if device_metrics else jax.device_get(outputs),
                    {k: np.asarray(chunk[k]) for k in names},
                    item.n_real,
                )
            if want_loss:
                want_loss = _add_loss(host, losses, outputs, item, has_metrics)
            if not device_metrics:  # else: deleted once its batch's metrics ran
                _delete(outputs)
            if item.ends_batch:
                if has_metrics:
                    leaves, n_real = batch.run(host, device_metrics)
                    metrics.add_leaves(leaves, n_real=n_real)
                advance_progress_counter()
                if bar is not None:
                    bar.step()
            inside = not item.ends_batch
            index += item.ends_batch
    finally:
        feed.close()
    nonfinite = tally.total()
    result = _finalized(host, split, metrics, losses, has_metrics=has_metrics)
    training = isinstance(previous, phases.TrainStepping)
    at_epoch = host.current_epoch if training else None
    _warn_nonfinite(split, result, at_epoch)
    report_nonfinite_outputs(split, result, nonfinite, at_epoch)
    return result


def _begin_pass(
    host: EvalHost, split: str, previous: phases.Phase, batches: int
) -> Any:
    """Start the split's progress line (when there is one) and enter EvalStepping;
    return the progress bar, or None."""
    bar = host.progress()
    if bar is not None:  # the line first, so a monitor's view matches the screen
        epoch = host.current_epoch if isinstance(previous, phases.TrainStepping) else 0
        max_epochs = host.config.max_epochs if epoch else 0
        bar.begin(split, batches, epoch=epoch, max_epochs=max_epochs)
    host.set_phase(phases.EvalStepping())
    return bar


def _open_feed(host: EvalHost, split: str, source: Any) -> Any:
    """The split's eval feed, at the handle's eval width (fixed from the split's
    first batch when no pass has fixed it yet)."""
    select = host.prepared.routing.fields["forward"].select
    if host.eval_width is None:
        probe = first_batch(split, source)
        host.eval_width = eval_width_for(
            batch_size(probe, select(tuple(probe))), host.config.n_devs
        )
    return open_eval_feed(
        source,
        select=functools.lru_cache(maxsize=8)(select),
        width=process_width(host.eval_width),
        name=split,
        placement=host.prepared.ctx.placement,
    )


def _finalized(
    host: EvalHost,
    split: str,
    metrics: MetricAccumulator,
    losses: _LossMean,
    *,
    has_metrics: bool,
) -> dict[str, Any]:
    """The pass's metrics as the split reports them: the metrics and the loss
    joined, through `finalize_metrics` when the experiment has it, each leaf
    plain Python."""
    # With custom metrics, eval_loss's keys join what finalize_metrics returns;
    # without them the loss is the metric, and finalize_metrics sees it.
    if has_metrics:
        combined, loss_part = metrics.result(), losses.result()
        _refuse_collisions("metrics", combined, loss_part)
    else:
        combined, loss_part = losses.result(), {}
    finalize = host.prepared.hooks.get("finalize_metrics")
    if finalize is not None:
        combined = finalize(host.experiment, combined, split)
        if not isinstance(combined, Mapping):
            raise HookError(
                f"finalize_metrics must return a dict; it returned "
                f"{type(combined).__name__}."
            )
        _refuse_collisions("finalize_metrics", combined, loss_part)
    refuse_unreduced(combined, metrics.concatenated)
    _refuse_reserved(combined, "finalize_metrics" if finalize else "metrics")
    combined = {**dict(combined), **loss_part}
    return {k: _plain_tree(v) for k, v in dict(combined).items()}


def _refuse_reserved(combined: Mapping[str, Any], source: str) -> None:
    if NONFINITE_OUTPUTS in combined:
        raise HookError(
            f"{source} returns `{NONFINITE_OUTPUTS}`, the key evaluation reserves "
            f"for its count of NaN or infinite forward outputs (the epoch it is "
            f"above zero ranks no checkpoint). Rename the metric."
        )


def _gathered(
    host: EvalHost, item: EvalStaged, counts: np.ndarray
) -> tuple[EvalStaged, Any]:
    """Across processes: the chunk as one process would see it (every process's
    real rows, rank by rank, `counts` of them) and the forward outputs of those
    rows, on the host of every process alike."""
    width = process_width(host.eval_width or 0)
    spread = forward_padded(host, item.device, None)
    outputs = gather_outputs(spread, counts)
    _delete(spread)
    fields = gather_fields(item.host, counts, width)
    return EvalStaged(fields, item.device, int(counts.sum()), item.ends_batch), outputs


def _warn_nonfinite(split: str, metrics: Mapping[str, Any], epoch: int | None) -> None:
    """Warn of NaN or infinite scalar metrics: they are logged as they are, but the
    checkpointer never ranks by one (the epoch's record is kept unscored)."""
    bad = {
        name: value
        for name, value in metrics.items()
        if isinstance(value, numbers.Real) and not math.isfinite(value)
    }
    if not bad:
        return
    shown = ", ".join(f"`{name}` = {value}" for name, value in bad.items())
    when = f" at epoch {epoch}" if epoch is not None else ""
    warnings.warn(
        f"Split `{split}` scored non-finite metrics{when}: {shown}. They are "
        f"reported as they are, but a non-finite value never ranks a checkpoint: "
        f"the checkpointer keeps this epoch's record unscored (a Last selector may "
        f"keep it; Best never picks it). Check the metrics hook for a division by "
        f"zero, or the model for a diverged output.",
        NitroWarning,
        stacklevel=user_stacklevel(),
    )


class _BatchParts:
    """The metrics' inputs from the chunks of one source batch, until its last.

    A batch wider than the eval width runs in chunks; `metrics` sees the batch once,
    whole: the chunks' sliced outputs (host arrays, or device arrays for device
    residency) and their routed fields are joined along the batch axis.
    """

    def __init__(self) -> None:
        self.pieces: list[Any] = []
        self.fields: list[dict[str, Any]] = []
        self.n_real = 0

    def add(self, outputs: Any, fields: dict[str, Any], n_real: int) -> None:
        self.pieces.append(outputs)
        self.fields.append(fields)
        self.n_real += n_real

    def run(self, host: EvalHost, device: bool) -> tuple[list[Any], int]:
        """`metrics` on the whole batch as `MetricLeaf`s, and its real count;
        the parts are cleared (and, on the device, deleted)."""
        pieces, n_real = self.pieces, self.n_real
        fields = _joined(self.fields, np.concatenate)
        self.pieces, self.fields, self.n_real = [], [], 0
        if not device:
            outputs = _joined(pieces, np.concatenate)
            result = host.prepared.hooks["metrics"](host.experiment, outputs, **fields)
            return flatten_metrics(result), n_real
        outputs = _joined(pieces, jnp.concatenate)
        try:
            leaves = run_on_outputs(
                host, "eval_metrics", outputs, fields, tuple(fields)
            )
        finally:
            _delete(pieces)
            _delete(outputs)
        return leaves, n_real


def _joined(pieces: list[Any], concatenate: Callable[..., Any]) -> Any:
    """The pieces' trees joined leaf by leaf along the batch axis (one: as it is)."""
    if len(pieces) == 1:
        return pieces[0]
    return jax.tree.map(lambda *leaves: concatenate(leaves, axis=0), *pieces)


def _refuse_collisions(
    source: str, keys: Mapping[str, Any], loss_part: Mapping[str, Any]
) -> None:
    for key in keys:
        if key in loss_part:
            origin = (
                "the loss itself"
                if key == "loss"
                else f"the loss hook's term `{key.removeprefix('loss/')}`"
            )
            raise HookError(
                f"{source} returns `{key}` while eval_loss is on, which also reports "
                f"`{key}` ({origin}): the two sources would collide. Rename the key "
                f"in {source}, or turn eval_loss off."
            )


class _LossMean:
    """The eval loss and its terms, averaged over the source's batches.

    Each chunk's loss is the mean over its own samples. A batch wider than the eval
    width runs in chunks, which are weighted by their real counts so that the batch
    counts once: otherwise the average would depend on where a short batch fell,
    since the first batch sets the width.
    """

    def __init__(self) -> None:
        self._batches = MetricAccumulator()
        self._batch = MetricAccumulator()

    def add(self, values: Mapping[str, Any], n_real: int, ends_batch: bool) -> None:
        for key, value in values.items():
            weighted = np.asarray(value, np.float64) * n_real
            self._batch.add_leaf((key,), weighted, n_real)
        if ends_batch:
            self.end_batch()

    def end_batch(self) -> None:
        for key, value in self._batch.result().items():
            self._batches.add_leaf((key,), value, 1)
        self._batch = MetricAccumulator()

    def result(self) -> dict[str, Any]:
        return self._batches.result()


def _add_loss(
    host: EvalHost,
    losses: _LossMean,
    outputs: Any,
    item: EvalStaged,
    has_metrics: bool,
) -> bool:
    """Add the chunk's loss (and its terms) to `losses`; False stops the loss.

    With custom metrics, `eval_loss` skips a split whose batches lack the fields
    `loss` declares; without them the loss is the metric, and the error stands.
    """
    chunk = item.host
    try:
        names = host.prepared.routing.fields["loss"].select(tuple(chunk))
    except RoutingError:
        if has_metrics:
            return False
        raise
    loss, terms = run_on_outputs(host, "eval_loss", outputs, chunk, names)
    values = {"loss": loss, **{f"loss/{term}": v for term, v in terms.items()}}
    losses.add(values, item.n_real, item.ends_batch)
    return True


def _plain_tree(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain_tree(v) for k, v in value.items()}
    if isinstance(value, jax.Array):
        value = np.asarray(value)
    return plain(value)


def predict_batch(host: EvalHost, batch: Any) -> Any:
    """Host outputs of forward on one batch, sliced to its real sample count."""
    batch = as_batch(batch, "predict takes a batch dict such as {'img': images}.")
    names = host.prepared.routing.fields["forward"].select(tuple(batch))
    if host.eval_width is None:
        host.eval_width = padded_width(
            batch_size(batch, names), host.config.n_devs * jax.process_count()
        )
    previous = host.phase
    host.set_phase(phases.EvalStepping())
    pieces = []
    try:
        for chunk in _chunks(batch, names, host.eval_width):
            outputs, _ = forward_chunk(host, chunk, names)
            pieces.append(jax.device_get(outputs))
            _delete(outputs)
    except BaseException:
        host.restore_phase(previous)
        raise
    _leave_eval(host, previous)
    return _joined(pieces, np.concatenate)
