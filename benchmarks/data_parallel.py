"""Data parallelism on 4 CPU devices against one: correctness and what it costs.

The four devices are XLA's forced host devices
(`--xla_force_host_platform_device_count`), which share the same CPU cores, so no
speedup is expected: this measures what the mesh machinery costs per step (the
batch split, the collectives, the arguments placed before each call) and that the
numbers agree. Each layout trains the compute-bound MLP (784-1024-1024-10, batch
256, 12 batches an epoch) from the same weights; the epoch time is the median over
epochs 2..N (the first carries the compile), and the parameter difference is
against the single-device run.

    python benchmarks/data_parallel.py [--epochs 6]
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import statistics  # noqa: E402

from _common import WORKLOADS, make_experiment, synthetic_batches  # noqa: E402

LAYOUTS = {
    "1 device": {},
    "4 devices, replicated": {"n_devs": 4},
    "4 devices, fsdp": {"n_devs": 4, "sharding": "fsdp"},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=6)
    args = parser.parse_args()

    import jax
    import numpy as np

    import jaxnitro as nx

    widths, batch, count = WORKLOADS["compute_bound_mlp"]
    experiment = make_experiment(widths, synthetic_batches(batch, count))
    reference = None
    header = ("layout", "epoch s", "ratio", "max |dp|", "param MB/dev")
    print("{:24} {:>8} {:>6} {:>9} {:>12}".format(*header))
    for name, keywords in LAYOUTS.items():
        nitro = nx.Nitro(
            experiment(max_epochs=args.epochs),
            logger=None,
            checkpointer=None,
            **keywords,
        )
        nitro.train()
        seconds = statistics.median(nitro.history.column("seconds")[1:])
        params = jax.device_get(nitro.parameters)
        if reference is None:
            reference = (seconds, params)
        diff = max(
            float(np.max(np.abs(a - b)))
            for a, b in zip(
                jax.tree.leaves(params), jax.tree.leaves(reference[1]), strict=True
            )
        )
        per_device = max(row["params"] for row in nitro.memory_report().values())
        print(
            f"{name:24} {seconds:8.3f} {seconds / reference[0]:6.2f} {diff:9.2e} "
            f"{per_device / 2**20:12.2f}"
        )


if __name__ == "__main__":
    main()
