"""Data parallelism on 4 devices against one: correctness and what it costs.

By default the four devices are XLA's forced host devices
(`--xla_force_host_platform_device_count`), which share the same CPU cores, so no
speedup is expected: this measures what the mesh machinery costs per step (the
batch split, the collectives, the arguments placed before each call) and that the
numbers agree. Each layout trains the compute-bound MLP (784-1024-1024-10, batch
256, 12 batches an epoch) from the same weights; the epoch time is the median over
epochs 2..N (the first carries the compile), and the parameter difference is
against the single-device run.

Forced host devices exist only on the CPU platform, so the script sets
`JAX_PLATFORMS=cpu` and adds the flag to `XLA_FLAGS` for its own process, before JAX
starts, on any machine (an accelerator machine included: it runs there on the host's
CPU and leaves the accelerator alone), and its banner says so. `--native` uses the
backend's own devices instead, and stops with a message where there are fewer than 4.

    python benchmarks/data_parallel.py [--epochs 6]
    python benchmarks/data_parallel.py --native    # a machine with 4+ accelerators
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

from _common import WORKLOADS, banner, make_experiment, synthetic_batches

DEVICES = 4
FORCE_FLAG = "--xla_force_host_platform_device_count"
TOO_FEW_DEVICES = (
    "data_parallel.py needs {wanted} devices; this backend has {found} ({kind}). "
    "Run it without --native: it then forces {wanted} CPU host devices for itself."
)

LAYOUTS = {
    "1 device": {},
    f"{DEVICES} devices, replicated": {"n_devs": DEVICES},
    f"{DEVICES} devices, fsdp": {"n_devs": DEVICES, "sharding": "fsdp"},
}


def force_cpu_devices() -> str:
    """Pin this process to the CPU platform with `DEVICES` host devices (before JAX
    starts); what it set, for the banner."""
    os.environ["JAX_PLATFORMS"] = "cpu"
    flags = os.environ.get("XLA_FLAGS", "")
    if FORCE_FLAG not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {FORCE_FLAG}={DEVICES}".strip()
    return (
        f"JAX_PLATFORMS=cpu and XLA_FLAGS={os.environ['XLA_FLAGS']} set by this script"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument(
        "--native",
        action="store_true",
        help=f"the backend's own devices (needs {DEVICES}), not forced CPU devices",
    )
    args = parser.parse_args()
    note = "the backend's own devices (--native)"
    if not args.native:
        note = force_cpu_devices()

    import jax
    import numpy as np

    import jaxnitro as nx

    print(f"{banner()}; {note}")
    devices = jax.devices()
    if len(devices) < DEVICES:
        sys.exit(
            TOO_FEW_DEVICES.format(
                wanted=DEVICES, found=len(devices), kind=devices[0].device_kind
            )
        )
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
