"""One of two jax.distributed CPU processes on a loopback coordinator; it builds a
Nitro and prints the error (tests/devices/test_process.py)."""

import sys

import jax

port, index = sys.argv[1], int(sys.argv[2])
jax.config.update("jax_platforms", "cpu")
jax.distributed.initialize(
    f"127.0.0.1:{port}", num_processes=2, process_id=index, initialization_timeout=60
)

from experiments import Tiny  # noqa: E402

import jaxnitro as nx  # noqa: E402

try:
    nx.Nitro(Tiny(), logger=None, checkpointer=None)
except nx.NotYetSupportedError as error:
    print(f"refused: {error}")
jax.distributed.shutdown()
