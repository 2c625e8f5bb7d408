"""A training script for the stop-agreement test (tests/devices/test_agreement.py),
run under `nitro launch` or as one plain process:
`python dist_stop_worker.py RUN_DIR EPOCHS STOP N_DEVS`.

It trains `Sharded` (dist_worker.py: 4 global batches of 16 an epoch, each process
feeding its rows) to EPOCHS, continuing the run RUN_DIR holds if there is one. With
STOP=1, rank 0 alone asks to stop (`request_stop`) while its train split yields the
second batch of epoch 2 (the first epoch-2 step, 5, has run; step 6 has not been
dispatched), and rank 1 never asks; with STOP=2 rank 0 sends itself a SIGTERM
there instead (a preemption that reached one host). Agreement points fall every
2 steps here whatever the step time (`AGREE_MOST_STEPS = 2`, `AGREE_SECONDS`
out of reach): steps 1, 3, the epoch end at 4, then 6, so the request lands
between the points at 4 and 6 and the ranks agree at step 6, mid-epoch. It prints
where it stopped and why.
"""

import os
import signal
import sys
from pathlib import Path

import jax
from dist_worker import Sharded

import jaxnitro as nx
from jaxnitro.devices import agreement


class StopsInEpoch2(list):
    """Train batches that call `request_stop` on the handle when they yield the
    second batch of epoch 2."""

    nitro = None
    by_sigterm = False
    """Whether to send this process a SIGTERM instead of calling request_stop."""

    def __iter__(self):
        for index, batch in enumerate(list.__iter__(self)):
            if index == 1 and self.nitro is not None and self.nitro.current_epoch == 2:
                if self.by_sigterm:
                    os.kill(os.getpid(), signal.SIGTERM)
                else:
                    self.nitro.request_stop()
            yield batch


def main(run_dir: str, epochs: int, stop: int, n_devs: int) -> None:
    agreement.AGREE_MOST_STEPS = 2  # agreement points inside a 4-step epoch,
    agreement.AGREE_SECONDS = 1e9  # every 2 steps, however long a step takes
    dist = nx.init_distributed()
    data = Sharded().build_data(dist)
    if stop and nx.rank(dist) == 0:
        data["train"] = StopsInEpoch2(data["train"])
        data["train"].by_sigterm = stop == 2
    keywords = {"run_dir": run_dir, "max_epochs": epochs, "data": data}
    keywords["n_devs"] = n_devs
    if (Path(run_dir) / "manifest.json").exists():
        keywords["resume"] = "auto"
    nitro = nx.Nitro(Sharded(), **keywords)
    if isinstance(data["train"], StopsInEpoch2):
        data["train"].nitro = nitro
    nitro.train()
    where = f"rank {jax.process_index()} of {jax.process_count()}"
    print(f"{where} ended at step {nitro.current_step}: {nitro.stop_reason}")


if __name__ == "__main__":
    args = sys.argv[1:]
    main(args[0], *(int(a) for a in args[1:]))
