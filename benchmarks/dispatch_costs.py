"""What each piece of a training loop's per-step host work costs on this backend.

A hand-written `jax.jit` step over the tutorial MLP (784-128-10, batch 100, RAdam,
donated state), timed per step over `--steps` steps in several variants, each a
thing a training loop may do per step beside the dispatch:

- `numpy batch`: the batch handed over as NumPy arrays (the executable transfers it):
  the hand-written loop, the floor the other benchmarks measure against;
- `device batch`: the batches already on the device;
- `+ read loss lag 1`: `float(loss)` of the previous step after each dispatch;
- `+ read loss lag 8`: the same, eight steps late;
- `+ async copy, read lag 8`: `copy_to_host_async()` at dispatch, read eight late;
- `+ is_ready`: one `is_ready()` poll a step;
- `+ numpy rng`: a NumPy `uint32[3]` argument a step (a host-to-device transfer);
- `+ placed scalar`: a `jax.device_put` of a Python int a step;
- `staged by a thread`: the batches placed by a second thread through a queue while
  the loop runs (the prefetch stream's transfer thread);
- `block 8 placed in loop`: every 8 steps the loop stacks 8 batches (`np.stack`) and
  places the block with one transfer; each step's program reads its row (a device
  scalar position);
- `block 8 staged by a thread`: the same blocks stacked and placed by a second thread
  through a queue of 2 while the loop runs;
- `8 batches placed by a thread`: a second thread places 8 batches with one
  `device_put` of the list (no stack), the loop takes each as a device batch;
- `scan 8`: eight steps a dispatch over stacked device batches (`lax.scan`);
- `while 8 (dynamic n)`: the same under `lax.fori_loop` with a traced trip count, so
  one program serves every call length up to 8.

Prints microseconds a step for each; ratios are to `numpy batch`. The variants that
take 8 steps at a time run the whole blocks of 8 in `--steps` (8 or more).

    python benchmarks/dispatch_costs.py --steps 600
"""

from __future__ import annotations

import argparse
import queue
import threading
import time

from _common import apply, banner, cross_entropy, init_params, synthetic_batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    if args.steps < 8:
        parser.error(f"--steps must be 8 or more (one dispatch of 8), got {args.steps}")

    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    print(banner())
    widths = (784, 128, 10)
    tx = optax.radam(1e-3)
    host = synthetic_batches(100, 64)
    device = [jax.device_put(b) for b in host]

    def step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(lambda p: cross_entropy(apply(p, x), y))(
            params
        )
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    def step_rng(params, opt_state, x, y, rng):
        params, opt_state, loss = step(params, opt_state, x, y)
        return params, opt_state, loss + 0.0 * rng[1].astype(jnp.float32)

    one = jax.jit(step, donate_argnums=(0, 1))
    with_rng = jax.jit(step_rng, donate_argnums=(0, 1))

    def scanned(params, opt_state, xs, ys):
        def body(carry, batch):
            p, o, loss = step(*carry, *batch)
            return (p, o), loss

        (params, opt_state), losses = jax.lax.scan(body, (params, opt_state), (xs, ys))
        return params, opt_state, losses

    def looped(params, opt_state, xs, ys, n):
        def body(i, carry):
            p, o, losses = carry
            p, o, loss = step(p, o, xs[i], ys[i])
            return p, o, losses.at[i].set(loss)

        losses = jnp.zeros((xs.shape[0],), jnp.float32)
        return jax.lax.fori_loop(0, n, body, (params, opt_state, losses))

    many = jax.jit(scanned, donate_argnums=(0, 1))
    dyn = jax.jit(looped, donate_argnums=(0, 1))
    indexed = jax.jit(
        lambda p, o, xs, ys, j: step(p, o, xs[j], ys[j]), donate_argnums=(0, 1)
    )
    positions = jax.device_put([np.int32(j) for j in range(8)])

    def block_of(i: int) -> tuple:
        rows = [host[(i + j) % len(host)] for j in range(8)]
        return tuple(np.stack([b[k] for b in rows]) for k in ("x", "y"))

    stacked = [
        (
            jax.device_put(np.stack([b["x"] for b in host[i : i + 8]])),
            jax.device_put(np.stack([b["y"] for b in host[i : i + 8]])),
        )
        for i in range(0, 64, 8)
    ]
    count = np.int32(8)
    placed_count = jax.device_put(count)

    def fresh():
        p = init_params(widths)
        return p, tx.init(p)

    def run(variant: str, steps: int) -> float:
        p, o = fresh()
        p, o, loss = one(p, o, device[0]["x"], device[0]["y"])
        loss.block_until_ready()
        losses: list = []
        q: queue.Queue = queue.Queue(maxsize=4 if variant.startswith("staged") else 2)
        # The variants taking 8 steps at a time run the whole blocks of 8 in `steps`.
        whole = steps // 8 * 8

        def produce():
            staged = variant.startswith("staged")
            for i in range(0, steps if staged else whole, 1 if staged else 8):
                if staged:
                    q.put(jax.device_put(host[i % len(host)]))
                elif variant.startswith("block"):
                    q.put(jax.device_put(block_of(i)))
                else:
                    rows = [host[(i + j) % len(host)] for j in range(8)]
                    q.put(jax.device_put(rows))

        producer = threading.Thread(target=produce, daemon=True)
        start = time.perf_counter()
        if variant in ("block 8 staged by a thread", "8 batches placed by a thread"):
            producer.start()
        if variant.startswith("block") or variant.startswith("8 batches"):
            for i in range(0, whole, 8):
                if variant == "block 8 placed in loop":
                    xs, ys = jax.device_put(block_of(i))
                else:
                    got = q.get()
                for j in range(8):
                    if variant == "8 batches placed by a thread":
                        p, o, loss = one(p, o, got[j]["x"], got[j]["y"])
                    else:
                        if variant == "block 8 staged by a thread":
                            xs, ys = got
                        p, o, loss = indexed(p, o, xs, ys, positions[j])
            loss.block_until_ready()
            return (time.perf_counter() - start) / whole
        if variant.startswith("scan") or variant.startswith("while"):
            for i in range(whole // 8):
                xs, ys = stacked[i % len(stacked)]
                if variant.startswith("scan"):
                    p, o, loss = many(p, o, xs, ys)
                else:
                    p, o, loss = dyn(p, o, xs, ys, placed_count)
            loss.block_until_ready()
            return (time.perf_counter() - start) / whole
        if variant == "staged by a thread":
            producer.start()
        for i in range(steps):
            if variant == "numpy batch":
                b = host[i % len(host)]
            elif variant == "staged by a thread":
                b = q.get()
            else:
                b = device[i % len(device)]
            if variant == "+ numpy rng":
                rng = np.array([0, i, 0], np.uint32)
                p, o, loss = with_rng(p, o, b["x"], b["y"], rng)
            elif variant == "+ placed scalar":
                rng = jax.device_put(np.array([0, i, 0], np.uint32))
                p, o, loss = with_rng(p, o, b["x"], b["y"], rng)
            else:
                p, o, loss = one(p, o, b["x"], b["y"])
            if variant == "+ read loss lag 1":
                if losses:
                    float(losses.pop())
                losses.append(loss)
            elif variant == "+ read loss lag 8":
                losses.append(loss)
                if len(losses) > 8:
                    float(losses.pop(0))
            elif variant == "+ async copy, read lag 8":
                loss.copy_to_host_async()
                losses.append(loss)
                if len(losses) > 8:
                    float(losses.pop(0))
            elif variant == "+ is_ready":
                losses.append(loss)
                while losses and losses[0].is_ready():
                    float(losses.pop(0))
                if len(losses) > 64:
                    float(losses.pop(0))
        loss.block_until_ready()
        return (time.perf_counter() - start) / steps

    variants = [
        "numpy batch",
        "device batch",
        "+ read loss lag 1",
        "+ read loss lag 8",
        "+ async copy, read lag 8",
        "+ is_ready",
        "+ numpy rng",
        "+ placed scalar",
        "staged by a thread",
        "block 8 placed in loop",
        "block 8 staged by a thread",
        "8 batches placed by a thread",
        "scan 8",
        "while 8 (dynamic n)",
    ]
    for v in variants:  # compile and warm every variant
        run(v, 16)
    best = {v: float("inf") for v in variants}
    for _ in range(args.reps):
        for v in variants:
            best[v] = min(best[v], run(v, args.steps))
    base = best["numpy batch"]
    for v in variants:
        print(f"{v:28s} {best[v] * 1e6:8.1f} us/step  {base / best[v]:6.3f}x")

    # Per-operation costs, outside any loop.
    block = block_of(0)
    ops = {
        "np.stack(8 batches)": lambda: block_of(0),
        "device_put(block of 8)": lambda: jax.device_put(block),
        "device_put(block of 8), ready": lambda: jax.block_until_ready(
            jax.device_put(block)
        ),
        "device_put(8 batches)": lambda: jax.device_put(host[:8]),
        "device_put(batch)": lambda: jax.device_put(host[0]),
        "device_put(uint32[3])": lambda: jax.device_put(np.zeros(3, np.uint32)),
    }
    ready = jnp.float32(1.0)
    ready.block_until_ready()
    ops["float(ready scalar)"] = lambda: float(ready)
    ops["is_ready()"] = lambda: ready.is_ready()
    for name, op in ops.items():
        for _ in range(10):
            op()
        start = time.perf_counter()
        for _ in range(200):
            op()
        print(f"{name:28s} {(time.perf_counter() - start) / 200 * 1e6:8.1f} us")


if __name__ == "__main__":
    main()
