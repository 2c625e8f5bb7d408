"""A training script for the multi-process tests (tests/devices/test_distributed.py),
run under `nitro launch` or as one plain process:
`python dist_worker.py RUN_DIR [N_DEVS [DIE_AT [EPOCHS]]]`.

It trains `Sharded`, a Tiny on a train split only, whose build_data feeds this
process's shard of every global batch of 16 (`dist.shard`). With DIE_AT, rank 1 ends
itself (os._exit(3)) at the DIE_AT-th batch it reads (0: never), as a crashed host
would. With EPOCHS above 2 it resumes the run RUN_DIR holds and trains to EPOCHS.
It never joins the job itself unless it dies: `Nitro(...)` joins from the
environment `nitro launch` sets.
"""

import os
import sys

import jax
from experiments import Tiny, make_batches

import jaxnitro as nx

GLOBAL_BATCH = 16


class Sharded(Tiny):
    """Tiny's train split (4 global batches of 16), each process feeding its rows."""

    max_epochs: int = 2

    def build_data(self, dist):
        whole = make_batches(self.n_train, self.n_train)[0]
        parts = {
            k: v if dist is None else dist.shard(v, GLOBAL_BATCH)
            for k, v in whole.items()
        }
        local = GLOBAL_BATCH // nx.world_size(dist)
        n = len(parts["x"])
        return {
            "train": [
                {k: v[s : s + local] for k, v in parts.items()}
                for s in range(0, n, local)
            ]
        }


class DiesAt(list):
    """Train batches whose iteration ends the process (os._exit(3)) when it is
    about to yield its `at`-th batch in all (setup's probe reads one), as a host
    that dies mid-run would."""

    def __init__(self, batches, at):
        super().__init__(batches)
        self.at, self.yielded = at, 0

    def __iter__(self):
        for batch in list.__iter__(self):
            self.yielded += 1
            if self.yielded == self.at:
                os._exit(3)
            yield batch


def count_equality_checks() -> list:
    """The values JAX checks for equality across processes from now on (each check
    a collective): what the training loop should not pay per step."""
    from jax.experimental import multihost_utils

    seen: list = []
    check = multihost_utils.assert_equal

    def counted(value, fail_message=""):
        seen.append(value)
        return check(value, fail_message)

    multihost_utils.assert_equal = counted
    return seen


def main(
    run_dir: str, n_devs: int = 1, die_at: int | None = None, epochs: int = 2
) -> None:
    keywords = {"run_dir": run_dir, "n_devs": n_devs, "max_epochs": epochs}
    # Set by a test that trains every rank in calls of several steps.
    keywords["steps_per_call"] = int(os.environ.get("NITRO_TEST_STEPS_PER_CALL", "1"))
    if epochs > Sharded.max_epochs:  # continue the run this run_dir holds
        keywords["resume"] = "auto"
    if die_at:  # the data first: join explicitly (else Nitro(...) joins)
        dist = nx.init_distributed()
        data = Sharded().build_data(dist)
        if nx.rank(dist) == 1:
            data["train"] = DiesAt(data["train"], die_at)
        keywords.update(data=data, max_epochs=3, checkpointer=None)
    nitro = nx.Nitro(Sharded(), **keywords)
    checks = count_equality_checks()
    nitro.train()
    print(f"equality checks across processes during train: {len(checks)}")
    where = f"rank {jax.process_index()} of {jax.process_count()}"
    calls = nitro.config.steps_per_call
    print(f"{where} done at step {nitro.current_step} in calls of {calls} steps")


if __name__ == "__main__":
    args = sys.argv[1:]
    main(args[0], *(int(a) for a in args[1:]))
