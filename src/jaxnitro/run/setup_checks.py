"""Checks of one `Nitro` construction's inputs, each raising before work starts.

Pure functions of the values they check: the monitor pair, the compile options (tried
on a trivial program, so XLA refuses an unknown option now rather than minutes later),
the routed fields of a probe batch, and what decay_anchor="w0" anchors to.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..data.transfer import is_numeric_dtype
from ..errors import ConfigError, user_stacklevel
from ..optim.decay import anchor_mismatch


def check_monitor(monitor: Any) -> tuple[str, str]:
    """A monitor as a (metric, "min" | "max") pair; "val_loss" reads as "loss"."""
    if (
        isinstance(monitor, tuple)
        and len(monitor) == 2
        and monitor[1] in ("min", "max")
    ):
        name = str(monitor[0])
        if name == "val_loss":
            warnings.warn(
                'monitor "val_loss" is spelled "loss": metric names carry no split.',
                DeprecationWarning,
                stacklevel=user_stacklevel(),
            )
            name = "loss"
        return (name, str(monitor[1]))
    raise ConfigError(
        f'monitor must be a (metric, mode) pair with mode "min" or "max", such as '
        f'("acc", "max"); got {monitor!r}.'
    )


def check_compile_options(options: Any) -> dict[str, Any]:
    """XLA compiler options, validated now by compiling a trivial program with them."""
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise ConfigError(
            f"compile_options must be a dict of XLA compiler options, got "
            f"{type(options).__name__}."
        )
    for key, value in options.items():
        if not isinstance(key, str) or not isinstance(value, bool | int | float | str):
            raise ConfigError(
                f"compile_options: {key!r}={value!r}; keys are XLA option names and "
                f"values are bool, int, float or str."
            )
    if options:
        try:
            _probe_compile_options(tuple(sorted(options.items())))
        except Exception as error:
            raise ConfigError(
                f"compile_options were refused by XLA: {error}. Check the option "
                f"names and values."
            ) from None
    return dict(options)


@functools.cache
def _probe_compile_options(options: tuple[tuple[str, Any], ...]) -> None:
    """Compile a trivial program with `options`; an accepted set is probed once per
    process (a refusal raises, and is not cached), as a config is checked again each
    time a setup step derives a new one from it."""
    jax.jit(lambda: jnp.zeros(())).lower().compile(compiler_options=dict(options))


def check_numeric_fields(
    batch: Mapping[str, Any], names: Iterable[str], split: str
) -> None:
    """Refuse a routed field that cannot go to the device (strings, objects)."""
    for name in names:
        value = batch[name]
        if not isinstance(value, jax.Array) and not is_numeric_dtype(
            np.asarray(value).dtype
        ):
            raise ConfigError(
                f"Batch field `{name}` of split `{split}` is not a numeric array "
                f"({type(value).__name__}); a field a traced hook declares is "
                f"transferred to the device. Keep bookkeeping such as names in fields "
                f"no traced hook declares."
            )


def partial_batch_message(last: int, full: int) -> str:
    """The refusal of a train split that keeps a partial last batch."""
    return (
        f"The train split keeps a partial last batch ({last} samples, the others "
        f"{full}): a short batch would compile a second gradient program and weight "
        f"its samples differently. Drop it: nx.ArraySource(..., drop_last=True), "
        f"grain's .batch(n, drop_remainder=True), or drop_last=True on your loader."
    )


W0_MISMATCH = """\
w0 is a tree that does not match the parameters leaf for leaf: {problem}. Pass a tree \
shaped like what build_model returns (the same structure, each leaf the parameter's \
shape), or w0="build_model" / w0="weights"."""


W0_WEIGHTS_ON_RESUME = """\
w0="weights" anchors to the parameters a weights= source loads, but a resume takes no \
weights=: it restores the run's own parameters and continues exactly. To resume an \
L2-SP run trained with w0="weights", pass the transferred tree itself as w0=<tree>, \
e.g. w0=Nitro(e, weights=<the source it was fine-tuned from>, logger=None, \
checkpointer=None).parameters; setup checks it against the anchor checksum the record \
stores. Leaving w0 at "build_model" anchors to fresh build_model parameters instead, \
which the record refuses."""


def w0_provider(
    option: Any, fresh: Any, params: Any, has_weights: bool, *, resuming: bool = False
) -> Callable[[], Any]:
    """What decay_anchor="w0" anchors to, copied only if some group asks for it."""
    if option is None or (isinstance(option, str) and option == "build_model"):
        source = fresh
    elif isinstance(option, str) and option == "weights":
        if resuming:
            raise ConfigError(W0_WEIGHTS_ON_RESUME)
        if not has_weights:
            raise ConfigError(
                'w0="weights" anchors to the parameters a weights= source loads, but '
                "no weights= was given. Pass weights=..., or leave w0 at "
                '"build_model".'
            )
        source = params
    elif isinstance(option, str):
        raise ConfigError(
            f'w0={option!r}: it is "build_model", "weights", or a parameter tree.'
        )
    else:
        source = option
    cached: list[Any] = []

    def provide() -> Any:
        if not cached:
            problem = anchor_mismatch(source, params)
            if problem is not None:
                raise ConfigError(W0_MISMATCH.format(problem=problem))
            cached.append(jax.tree.map(jnp.array, source))  # training donates params
        return cached[0]

    return provide
