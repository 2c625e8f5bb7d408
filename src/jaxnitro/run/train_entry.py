"""`train(experiment, **kwargs)`: the one-call form of `Nitro(experiment,
**kwargs).train()`, one entry point around both."""

from __future__ import annotations

from typing import Any

from ..observe.entry import entry_point
from .handle import Nitro


def train(experiment: Any, preset: str | None = None, /, **kwargs: Any) -> Nitro:
    """`Nitro(experiment, **kwargs).train()`: build a handle and train it.

    One entry point: Idle is announced once, when training returns, not between the
    setup and the training. Every run keyword is a `Nitro` keyword; pass `run_ref=`
    to reach the handle while it trains (it is filled before the loop starts).

    Args:
        experiment: an `Experiment` instance; with `preset`, an `Experiment`
            subclass.
        preset: a preset name of that class: `train(E, "name", **kw)` is
            `Nitro(E, "name", **kw).train()`.
        **kwargs: the run keywords (see `Nitro`); in the preset form, field names
            too, which go to the recipe.

    Returns:
        Nitro: the trained handle: read `history`, `stop_reason` and `parameters`
        off it, or keep it for `evaluate`, `predict` and `set_device`.

    Raises:
        ConfigError: a refused keyword or value, at setup or during training (see
            `Nitro` and `Nitro.train` for each error and when it is raised).
        HookError: a missing hook, or one that returned the wrong thing.
        RoutingError: a batch lacks a field a hook declares.
        CheckpointError: a resume or weights source cannot be found, read or
            matched; a checkpoint metric that is missing or not finite.
        DivergenceError: a non-finite training loss under check_divergence.
        NotYetSupportedError: a setting whose feature has not landed (a
            `train_step` hook, ...).

    Example::

        nitro = nx.train(MnistMLP(max_epochs=20), run_dir="runs/mnist")
        nitro.history                                  # the per-epoch table
        nx.train(MnistMLP, "baseline", smoothing=0.1)  # a preset, one field changed
    """
    with entry_point():
        if preset is None:
            return Nitro(experiment, **kwargs).train()
        return Nitro(experiment, preset, **kwargs).train()
