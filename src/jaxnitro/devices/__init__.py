"""Which devices a run executes on: the process's device pin (`process`), the
data-parallel mesh and its sharding rules (`placement`), and what the training state
occupies on each device (`memory`)."""
