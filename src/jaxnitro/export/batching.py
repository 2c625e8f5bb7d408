"""Dynamic batching: concurrent requests merged into one program call, split back.

`nitro serve` runs one compiled program per exported batch size. Requests arrive
one sample (or a few) at a time; the `DynamicBatcher` holds the first request of a
batch for at most `max_delay` seconds while more arrive, merges them along the batch
axis up to `max_batch` rows, pads the merged batch with zeros up to the smallest
exported batch size that holds it (so only the exported, pre-compiled programs run),
calls the model once on a worker thread, and hands each request back its own rows.
A request larger than `max_batch` runs alone, through the bundle's program with a
symbolic batch dimension.
"""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import ConfigError

Arrays = dict[str, np.ndarray]
"""Wire tensors by name, batch axis first."""


@dataclass
class _Pending:
    """One request waiting in the queue: its inputs, their batch size, its future."""

    inputs: Arrays
    rows: int
    future: asyncio.Future[Arrays] = field(repr=False)


class DynamicBatcher:
    """Merges concurrent `submit` calls into batches of at most `max_batch` rows.

    Args:
        model: called with the merged wire inputs by name (each (rows, ...)); returns
            the outputs by name, batch axis first.
        batch_sizes: the exported batch sizes; a merged batch is zero-padded up to
            the smallest one that holds it. Their maximum is the default `max_batch`.
        max_batch: the most rows one call merges; at least 1.
        max_delay: seconds the first request of a batch waits for company; >= 0.

    Example::

        batcher = DynamicBatcher(load_bundle("export/v1"), batch_sizes=[1, 8])
        out = await batcher.submit({"x": np.zeros((1, 8), np.float32)})
    """

    def __init__(
        self,
        model: Callable[..., Mapping[str, np.ndarray]],
        *,
        batch_sizes: Sequence[int],
        max_batch: int | None = None,
        max_delay: float = 0.005,
    ) -> None:
        sizes = sorted({int(n) for n in batch_sizes})
        if not sizes or sizes[0] < 1:
            raise ConfigError(
                f"DynamicBatcher: batch_sizes must be positive integers, got "
                f"{list(batch_sizes)}; pass the bundle's manifest['batch_sizes']."
            )
        max_batch = sizes[-1] if max_batch is None else max_batch
        if max_batch < 1:
            raise ConfigError(
                f"DynamicBatcher: max_batch must be >= 1, got {max_batch}."
            )
        if max_delay < 0:
            raise ConfigError(
                f"DynamicBatcher: max_delay must be >= 0, got {max_delay}."
            )
        self.model = model
        self.batch_sizes = sizes
        self.max_batch = max_batch
        self.max_delay = max_delay
        self.calls: list[int] = []
        """The rows of the last 1000 model calls, padding excluded."""
        self.batches_run = 0
        """Model calls so far."""
        self.rows_run = 0
        """Rows (samples) through the model so far, padding excluded."""
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="nitro-serve"
        )
        self._queue: asyncio.Queue[_Pending] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None

    async def submit(self, inputs: Arrays) -> Arrays:
        """Queue one request's checked wire inputs; its outputs when its batch ran.

        Args:
            inputs: every wire input by name, each (rows, *sample_shape), already
                checked against the manifest (same rows for all).

        Returns:
            The outputs by name, each (rows, ...).

        Raises:
            Exception: whatever the model raised for the batch this request was in.
        """
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._task is None or self._task.done():
            self._start(loop)
        assert self._queue is not None
        rows = next(iter(inputs.values())).shape[0]
        future: asyncio.Future[Arrays] = loop.create_future()
        await self._queue.put(_Pending(inputs, rows, future))
        return await future

    async def aclose(self) -> None:
        """Stop the batching task and the worker thread."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._task = None
        self._executor.shutdown(wait=True)

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue = asyncio.Queue()
        self._task = loop.create_task(self._run(self._queue))

    async def _run(self, queue: asyncio.Queue[_Pending]) -> None:
        held: _Pending | None = None
        while True:
            first = held if held is not None else await queue.get()
            held = None
            batch, rows = [first], first.rows
            deadline = asyncio.get_running_loop().time() + self.max_delay
            while rows < self.max_batch:
                timeout = deadline - asyncio.get_running_loop().time()
                try:
                    if timeout <= 0:
                        item = queue.get_nowait()
                    else:
                        item = await asyncio.wait_for(queue.get(), timeout)
                except (asyncio.QueueEmpty, TimeoutError):
                    break
                if rows + item.rows > self.max_batch:
                    held = item  # the first of the next batch
                    break
                batch.append(item)
                rows += item.rows
            await self._call(batch, rows)

    async def _call(self, batch: list[_Pending], rows: int) -> None:
        self.calls = [*self.calls[-999:], rows]
        self.batches_run += 1
        self.rows_run += rows
        try:
            merged = self._merged(batch, rows)
            outputs = await asyncio.get_running_loop().run_in_executor(
                self._executor, lambda: dict(self.model(**merged))
            )
        except Exception as error:  # every request of the batch gets the error
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(error)
            return
        start = 0
        for p in batch:
            if not p.future.done():  # a cancelled request (client went away)
                p.future.set_result(
                    {name: v[start : start + p.rows] for name, v in outputs.items()}
                )
            start += p.rows

    def _merged(self, batch: list[_Pending], rows: int) -> Arrays:
        """The batch's inputs concatenated, zero-padded to an exported size."""
        padding = self._padded_size(rows) - rows
        return {
            name: np.concatenate(
                [
                    *(p.inputs[name] for p in batch),
                    np.zeros((padding, *value.shape[1:]), value.dtype),
                ]
            )
            for name, value in batch[0].inputs.items()
        }

    def _padded_size(self, rows: int) -> int:
        """The smallest exported batch size >= rows, or rows past the largest."""
        i = bisect.bisect_left(self.batch_sizes, rows)
        return self.batch_sizes[i] if i < len(self.batch_sizes) else rows
