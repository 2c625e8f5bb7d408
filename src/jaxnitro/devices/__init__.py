"""Which devices a run executes on: the process's device pin (`process`), the
data-parallel mesh and its sharding rules (`placement`), and what the training state
occupies on each device (`memory`)."""

from .distributed import Distributed as Distributed
from .distributed import init_distributed as init_distributed
from .distributed import rank as rank
from .distributed import world_size as world_size
from .process import setup_devices as setup_devices

__all__ = [
    "Distributed",
    "init_distributed",
    "rank",
    "setup_devices",
    "world_size",
]
