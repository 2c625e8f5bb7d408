"""One of two jax.distributed CPU processes on a loopback coordinator; it evaluates
while rank 0 alone requests a stop and prints the metrics, then builds the handles
a run across processes refuses (processes that feed different data) and prints
each error
(tests/devices/test_distributed.py): `python two_process_worker.py PORT INDEX`."""

import sys


def _val_with_empty_part(index: int) -> list:
    """A val split of two batches whose last one rank 1 feeds no rows of."""
    from experiments import make_batches

    first, last = make_batches(6, 4)
    if index == 1:
        last = {k: v[:0] for k, v in last.items()}
    return [first, last]


def _evaluate_stopped_by_rank_0(dist, index: int) -> dict:
    """Evaluate a val split of 3 global batches of 8 while rank 0 alone requests a
    stop in its first batch's metrics: every rank stops after that batch."""
    from dist_worker import Sharded
    from experiments import make_batches

    import jaxnitro as nx

    handle = []

    class StopsOnRank0(Sharded):
        def metrics(self, logits, *, y):
            if index == 0:
                handle[0].request_stop()
            return {"rows": (len(y), "sum")}

    val = [{k: dist.shard(v, 8) for k, v in make_batches(24, 24)[0].items()}]
    val = [{k: v[s : s + 4] for k, v in val[0].items()} for s in range(0, 12, 4)]
    nitro = nx.Nitro(
        StopsOnRank0(),
        data={**Sharded().build_data(dist), "val": val},
        logger=None,
        checkpointer=None,
    )
    handle.append(nitro)
    return nitro.evaluate("val")


def main(port: str, index: int) -> None:
    import jax

    jax.config.update("jax_platforms", "cpu")
    import jaxnitro as nx

    dist = nx.init_distributed(f"127.0.0.1:{port}", 2, index, timeout_s=60)
    print(f"joined: rank {nx.rank(dist)} of {nx.world_size(dist)}")
    from dist_worker import Sharded
    from experiments import make_batches

    attempts = {
        "uneven": lambda: nx.Nitro(
            Sharded(n_train=64 if index == 0 else 48), logger=None, checkpointer=None
        ),
        "uneven val": lambda: nx.Nitro(
            Sharded(),
            data={
                **Sharded().build_data(dist),
                "val": make_batches(16 if index == 0 else 8, 8),
            },
            logger=None,
            checkpointer=None,
        ),
        "empty part": lambda: nx.Nitro(
            Sharded(),
            data={**Sharded().build_data(dist), "val": _val_with_empty_part(index)},
            logger=None,
            checkpointer=None,
        ).validate(),
    }
    print(f"stopped evaluate: {_evaluate_stopped_by_rank_0(dist, index)}")
    for name, build in attempts.items():
        try:
            build()
        except nx.NitroError as error:
            print(f"{name} refused: {type(error).__name__}: {error}")
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
