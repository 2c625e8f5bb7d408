"""The prefetch pipeline against a loader that does real work, and against no loader.

(a) data_wait_frac with a loader that decodes and augments 28x28 images in NumPy,
    calibrated to cost about one training step per batch: inline, one producer
    thread and the fan-out (2, 3 and the default workers), in the framework's own
    training loop (the real XLA CPU step, whose compute shares the cores with the
    loader), and in
    a stream under a simulated accelerator step of the same length (device time
    that leaves the host's cores free; batches staged as on an accelerator).
(b) the framework's training loop on the tutorial-sized MLP fed by the prefetch
    paths, against the same loop over batches already on the device. The CPU
    backend does not stage batches on the "device" (its executables take host
    arrays); the staged rows show what staging would cost here. On an accelerator
    every path stages (the backend's default), so there the staged rows repeat
    the unstaged ones; the banner says which default this backend has.

The stream consumer in (a) is the loop the framework runs: a jitted MLP 784-128-10
step (RAdam), batch 100, each device batch released once its step is dispatched
(which also wakes the producers), and the previous step's loss read back after the
next step is dispatched.
data_wait_frac is time blocked in `next()` over the epoch's wall time, as the loop
logs it.

    python benchmarks/prefetch.py            # both parts
    python benchmarks/prefetch.py --quick    # fewer epochs

(c) what every staged path pays before the loop can run: a tutorial batch's copy to
    the device (one batch, and blocks of 8 and 16 stacked, each waited for alone and
    8 in flight), and the stack of a block on the loop's thread. On a CPU backend
    the "copy" is host memory to host memory.

The last row of (b) feeds the tutorial's Grain loader; where `grain` (or one of its
needs) cannot be imported, that row is left out and the script says why.
"""

from __future__ import annotations

import argparse
import statistics
import time
import zlib

import jax
import numpy as np
import optax
from _common import (
    apply,
    backend_info,
    banner,
    cross_entropy,
    init_params,
    make_experiment,
    median_seconds,
    paired_ratio,
)

from jaxnitro.data.prefetch import (
    NoPrefetch,
    PrefetchIterator,
    batch_stream,
    default_prefetch_workers,
)
from jaxnitro.logging.protocol import Logger

BATCH, BATCHES, WIDTHS = 100, 60, (784, 128, 10)
DEFAULT = default_prefetch_workers()


def make_step(optimizer: optax.GradientTransformation):
    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(
            lambda p: cross_entropy(apply(p, batch["x"]), batch["y"])
        )(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return jax.jit(step, donate_argnums=(0, 1))


class AugmentingLoader:
    """MNIST-like batches stored compressed; each batch is decoded and augmented.

    The fan-out trait: the plan is the epoch's permutation of batches, drawn from
    (seed, epoch); batch i's augmentation draws from (seed, epoch, i), so every
    worker count produces the same batches. The work is what NumPy does with the
    GIL released (zlib inflate, casts and arithmetic on whole arrays, random
    fills); `noise_rows` (0 to BATCH) scales it.
    """

    def __init__(self, *, noise_rows: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.blobs = []
        for _ in range(BATCHES):
            digits = rng.integers(0, 256, size=(BATCH, 28, 28), dtype=np.uint8)
            digits[:, :, :6] = 0  # some structure, so zlib has work to do
            self.blobs.append(zlib.compress(digits.tobytes(), 6))
        self.labels = rng.integers(0, 10, size=(BATCHES, BATCH))
        self.noise_rows, self.seed = noise_rows, seed
        self.epoch_token, self._epoch = 0, 0

    def __len__(self) -> int:
        return BATCHES

    def set_epoch(self, epoch: int) -> None:
        self._epoch = epoch

    def begin_epoch(self) -> tuple[int, np.ndarray]:
        rng = np.random.default_rng([self.seed, self._epoch])
        plan = (self._epoch, rng.permutation(BATCHES))
        self._epoch += 1
        self.epoch_token += 1
        return plan

    def batch_at(self, i: int, plan: tuple[int, np.ndarray]) -> dict[str, np.ndarray]:
        epoch, order = plan
        k = int(order[i])
        rng = np.random.default_rng([self.seed, epoch, i])
        raw = np.frombuffer(zlib.decompress(self.blobs[k]), np.uint8)  # decode
        img = raw.reshape(BATCH, 784).astype(np.float32)
        img *= np.float32(rng.uniform(0.8, 1.2) / 255.0)  # random contrast
        noisy = img[: self.noise_rows]  # sensor noise on some images
        noisy += rng.standard_normal(noisy.shape, dtype=np.float32) * np.float32(0.05)
        img = np.roll(img, int(rng.integers(-2, 3)), axis=1)  # random translation
        label = np.eye(10, dtype=np.float32)[self.labels[k]]
        return {"x": img, "y": label}

    def __iter__(self):
        plan = self.begin_epoch()
        return (self.batch_at(i, plan) for i in range(len(self)))


def run_epoch(step, state, split, epoch: int) -> tuple[float, float]:
    """One epoch the framework's way; (data_wait_frac, wall seconds)."""
    params, opt_state = state
    started = time.perf_counter()
    stream = batch_stream(split, ("x", "y"), epoch=epoch)
    previous = None
    for _host, device in stream:
        params, opt_state, loss = step(params, opt_state, device)
        stream.release(device)  # dispatched: the runtime frees it after use
        if previous is not None:
            float(previous)
        previous = loss
    float(previous)
    wall = time.perf_counter() - started
    stream.close()
    state[:] = [params, opt_state]
    return stream.stats().wait_seconds / wall, wall


def run_plain(step, state, batches) -> float:
    """One epoch over ready batches (device arrays, or host NumPy to the executable)."""
    params, opt_state = state
    started = time.perf_counter()
    previous = None
    for batch in batches:
        params, opt_state, loss = step(params, opt_state, batch)
        if previous is not None:
            float(previous)
        previous = loss
    float(previous)
    state[:] = [params, opt_state]
    return time.perf_counter() - started


def fresh_state(optimizer):
    params = init_params(WIDTHS)
    return [params, optimizer.init(params)]


def step_seconds(step, optimizer) -> float:
    loader = AugmentingLoader(noise_rows=0)
    plan = loader.begin_epoch()
    device = [jax.device_put(loader.batch_at(i, plan)) for i in range(BATCHES)]
    state = fresh_state(optimizer)
    run_plain(step, state, device)
    return statistics.median(run_plain(step, state, device) for _ in range(7)) / BATCHES


def loader_seconds(noise_rows: int) -> float:
    loader = AugmentingLoader(noise_rows=noise_rows)
    plan = loader.begin_epoch()
    indices = iter(range(40))
    return median_seconds(lambda: loader.batch_at(next(indices), plan), 40)


class SimulatedAccelerator:
    """A step that takes `seconds` of device time and no host CPU.

    Dispatch returns at once; the device runs steps back to back; reading a
    step's loss back waits until the device has finished it. This is how an
    accelerator looks to the host loop, which a CPU backend cannot show: there
    the "device" is the same two cores the loader runs on.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.busy_until = 0.0

    def __call__(self, params, opt_state, batch):
        del batch
        start = max(time.perf_counter(), self.busy_until)
        self.busy_until = start + self.seconds
        return params, opt_state, _Loss(self.busy_until)


class _Loss:
    def __init__(self, ready: float) -> None:
        self.ready = ready

    def __float__(self) -> float:
        time.sleep(max(0.0, self.ready - time.perf_counter()))  # the device's time
        return 0.0


def compare_producers(step, state, source, epochs: int) -> None:
    splits = {
        "inline (NoPrefetch)": NoPrefetch(source),
        "single producer (workers=1)": PrefetchIterator(source, workers=1),
        "fan-out, workers=2": PrefetchIterator(source, workers=2),
        "fan-out, workers=2, host_batches=8": PrefetchIterator(
            source, workers=2, host_batches=8
        ),
        "fan-out, workers=3": PrefetchIterator(source, workers=3),
        f"fan-out, default workers={DEFAULT}": PrefetchIterator(source),
    }
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in splits}
    run_epoch(step, state, splits["fan-out, workers=2"], 0)  # warm-up
    for epoch in range(epochs):
        for name, split in splits.items():
            results[name].append(run_epoch(step, state, split, epoch))
    for name, runs in results.items():
        frac = statistics.median(f for f, _ in runs)
        wall = statistics.median(w for _, w in runs)
        print(
            f"    {name:36s} data_wait_frac {frac:6.1%}   {BATCHES / wall:6.0f} steps/s"
        )


class DataWait(Logger):
    """A logger keeping the loop's once-per-epoch data_wait_frac; its other verbs are
    the protocol's, which do nothing."""

    def __init__(self) -> None:
        self.fracs: list[float] = []

    def log_metrics(self, metrics, *, step, epoch, context, **kw):
        if context == "data":
            self.fracs.append(metrics["data_wait_frac"])


def compare_in_the_loop(source, epochs: int) -> None:
    import jaxnitro as nx

    splits = {
        "inline (NoPrefetch)": nx.data.NoPrefetch(source),
        "single producer (workers=1)": nx.data.PrefetchIterator(source, workers=1),
        "fan-out, workers=2": nx.data.PrefetchIterator(source, workers=2),
        "fan-out, workers=2, host_batches=8": nx.data.PrefetchIterator(
            source, workers=2, host_batches=8
        ),
        "fan-out, workers=3": nx.data.PrefetchIterator(source, workers=3),
        f"fan-out, default workers={DEFAULT}": nx.data.PrefetchIterator(source),
    }
    for name, split in splits.items():
        waits = DataWait()
        nitro = nx.Nitro(
            make_experiment(WIDTHS, split)(max_epochs=epochs + 1),
            logger=waits,
            checkpointer=None,
        )
        nitro.train()
        frac = statistics.median(waits.fracs[1:])  # the first epoch compiles
        wall = statistics.median(row["seconds"] for row in nitro.history[2:])
        print(
            f"    {name:36s} data_wait_frac {frac:6.1%}   {BATCHES / wall:6.0f} steps/s"
        )


def part_a(step, optimizer, epochs: int, platform: str) -> None:
    t_step = step_seconds(step, optimizer)
    low, high = loader_seconds(0), loader_seconds(BATCH)
    rows = int(np.clip(round(BATCH * (t_step - low) / (high - low)), 0, BATCH))
    t_load = loader_seconds(rows)
    source = AugmentingLoader(noise_rows=rows)
    print(
        f"(a) loader: decode + augment, {t_load * 1e3:.2f} ms per batch alone "
        f"(noise on {rows} of {BATCH} images); median of {epochs} epochs of "
        f"{BATCHES} steps"
    )
    shares = "its compute shares the cores" if platform == "cpu" else "on the device"
    print(
        f"  the framework's loop, XLA {platform.upper()} step {t_step * 1e3:.2f} ms "
        f"alone ({shares}):"
    )
    compare_in_the_loop(source, epochs)
    print(f"  simulated accelerator step, {t_load * 1e3:.2f} ms of device time:")
    compare_producers(SimulatedAccelerator(t_load), [None, None], source, epochs)


def tutorial_samples(seed: int = 0) -> list[dict[str, np.ndarray]]:
    """The tutorial-sized samples: 784 random features, a one-hot label of 10."""
    rng = np.random.default_rng(seed)
    return [
        {
            "x": rng.normal(size=784).astype(np.float32),
            "y": np.eye(10, dtype=np.float32)[rng.integers(10)],
        }
        for _ in range(BATCH * BATCHES)
    ]


def tutorial_loader(samples: list[dict[str, np.ndarray]], seed: int = 0):
    """The tutorial's Grain loader over `samples` (raises ModuleNotFoundError
    without grain)."""
    import grain

    ds = grain.MapDataset.source(samples).shuffle(seed=seed)
    return ds.batch(BATCH, drop_remainder=True)


def numpy_batches(samples: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """`samples` in batches of BATCH, in order, stacked with NumPy."""
    return [
        {k: np.stack([s[k] for s in samples[i : i + BATCH]]) for k in ("x", "y")}
        for i in range(0, BATCH * BATCHES, BATCH)
    ]


class Prebuilt:
    """Batches already built on the host, with the fan-out trait: a pointer load."""

    def __init__(self, batches: list[dict[str, np.ndarray]]) -> None:
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def begin_epoch(self) -> None:
        return None

    def batch_at(self, i: int) -> dict[str, np.ndarray]:
        return self.batches[i]

    def __iter__(self):
        return iter(self.batches)


def part_b(epochs: int) -> None:
    import jaxnitro as nx
    import jaxnitro.loop.assembly as assembly
    import jaxnitro.loop.feed as feed

    samples = tutorial_samples()
    try:
        ds = tutorial_loader(samples)
        host = [ds[i] for i in range(BATCHES)]
    except ModuleNotFoundError as missing:  # grain, or one of its needs
        ds, no_grain = None, str(missing)
        host = numpy_batches(samples)  # the same samples, batched in order
    device = [jax.device_put(b) for b in host]
    backend_default = feed.stages_on_device
    started_copy = assembly.transfer

    def waited_copy(arrays, sharding=None, **kw):
        placed = started_copy(arrays, sharding, **kw)
        jax.block_until_ready(placed)
        return placed

    def loop(split, stage=False, wait=False):
        """`wait`: the prefetch thread waits for each block's copy, as it did
        before 2026-12-06's evening (the copy ran behind the queued calls)."""
        exp = make_experiment(WIDTHS, split)

        def run(n_epochs: int) -> list[float]:
            feed.stages_on_device = (lambda: True) if stage else backend_default
            assembly.transfer = waited_copy if wait else started_copy
            try:
                nitro = nx.Nitro(
                    exp(max_epochs=n_epochs + 1), logger=None, checkpointer=None
                )
                nitro.train()
            finally:
                feed.stages_on_device = backend_default
                assembly.transfer = started_copy
            return [row["seconds"] for row in nitro.history[2:]]

        return run

    sides = {
        "batches on the device": loop(device),
        "list of host batches (inline)": loop(host),
        "one producer": loop(nx.data.PrefetchIterator(Prebuilt(host), workers=1)),
        "fan-out, 2 workers": loop(nx.data.PrefetchIterator(Prebuilt(host), workers=2)),
        f"fan-out, default {DEFAULT} workers": loop(
            nx.data.PrefetchIterator(Prebuilt(host))
        ),
        "one producer, staged": loop(
            nx.data.PrefetchIterator(Prebuilt(host), workers=1), stage=True
        ),
        "fan-out, 2 workers, staged": loop(
            nx.data.PrefetchIterator(Prebuilt(host), workers=2), stage=True
        ),
        "one producer, staged, copy waited": loop(
            nx.data.PrefetchIterator(Prebuilt(host), workers=1), stage=True, wait=True
        ),
    }
    walls: dict[str, list[float]] = {name: [] for name in sides}
    for side in sides.values():
        side(1)  # compile once; later handles hit the cache
    for _ in range(epochs):
        for name, side in sides.items():
            walls[name] += side(3)
    base = walls["batches on the device"]
    print(
        f"(b) the framework's loop, tutorial MLP, {BATCHES} batches of {BATCH}: "
        f"throughput against the batches already on the device ({3 * epochs} "
        f"paired epochs)"
    )
    for name, times in walls.items():
        ratio = paired_ratio(base, times)
        per_step = statistics.median(times) / BATCHES * 1e3
        print(f"    {name:34s} {ratio:6.3f}x   {per_step:6.3f} ms/step")
    if ds is None:
        row = "the tutorial Grain loader, fan-out 2"
        print(f"    {row:34s} left out: {no_grain}")
        return
    grain_wall = statistics.median(loop(nx.data.PrefetchIterator(ds, workers=2))(3))
    print(
        f"    {'the tutorial Grain loader, fan-out 2':34s} "
        f"{statistics.median(base) / grain_wall:6.3f}x   "
        f"{grain_wall / BATCHES * 1e3:6.3f} ms/step (Grain's per-element Python)"
    )


def part_c() -> None:
    host = numpy_batches(tutorial_samples())
    device = jax.devices()[0]
    print("(c) the copy to the device: a tutorial batch, and blocks of batches")
    for count in (1, 8, 16):
        block = np.stack([b["x"] for b in host[:count]])

        def alone(block=block) -> None:
            jax.device_put(block, device).block_until_ready()

        def in_flight(block=block) -> None:
            jax.block_until_ready([jax.device_put(block, device) for _ in range(8)])

        alone(), in_flight()  # the first copies of each size: not timed
        one, eight = median_seconds(alone, 15), median_seconds(in_flight, 15) / 8
        mb = block.nbytes / 1e6
        print(
            f"    {count:2d} batches ({mb:5.2f} MB): {one * 1e6:8.1f} us alone "
            f"({block.nbytes / one / 1e9:5.2f} GB/s), {eight * 1e6:8.1f} us each with "
            f"8 in flight ({block.nbytes / eight / 1e9:5.2f} GB/s)"
        )
    rows = [b["x"] for b in host[:16]]
    stack = median_seconds(lambda: np.stack(rows), 15)
    print(f"    the stack of 16 batches on this thread: {stack * 1e6:8.1f} us")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer epochs")
    args = parser.parse_args()
    import jaxnitro.loop.feed as feed

    info = backend_info()
    staged = "stages" if feed.stages_on_device() else "does not stage"
    print(f"{banner(info)}; the loop {staged} batches on the device by default")
    optimizer = optax.radam(1e-3)
    step = make_step(optimizer)
    part_a(step, optimizer, epochs=3 if args.quick else 9, platform=info["platform"])
    part_b(epochs=3 if args.quick else 10)
    part_c()


if __name__ == "__main__":
    main()
