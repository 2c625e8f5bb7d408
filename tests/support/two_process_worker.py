"""One of two jax.distributed CPU processes on a loopback coordinator; it builds a
Nitro and prints the error (tests/devices/test_process.py):
`python two_process_worker.py PORT INDEX`."""

import sys


def main(port: str, index: int) -> None:
    import jax

    jax.config.update("jax_platforms", "cpu")
    jax.distributed.initialize(
        f"127.0.0.1:{port}",
        num_processes=2,
        process_id=index,
        initialization_timeout=60,
    )
    from experiments import Tiny

    import jaxnitro as nx

    try:
        nx.Nitro(Tiny(), logger=None, checkpointer=None)
    except nx.NotYetSupportedError as error:
        print(f"refused: {error}")
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
