"""The optimizer: rules and their per-step hyperparameters."""
