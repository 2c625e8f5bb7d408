"""Checks of one `Nitro` construction's inputs, each raising before work starts.

Pure functions of the values they check: the monitor pair, the compile options (tried
on a trivial program, so XLA refuses an unknown option now rather than minutes later),
the splits' batch counts, the probe batches (their routed fields, their size, the
fields the eval hooks need), and what decay_anchor="w0" anchors to.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..compile.boundary import owned_copy
from ..data.transfer import is_numeric_dtype
from ..errors import ConfigError, RoutingError, user_stacklevel
from ..experiment.routing import HookFields
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
    """Validate `compile_options` (XLA compiler options) before any compile.

    Every program a handle compiles gets these options, and they are part of each
    program's compile-cache key. They are checked here by compiling a trivial
    program with them (once per process for a set XLA accepted), so an unknown
    option or a bad value is refused when the handle is built, not minutes later
    at the first compile.

    Args:
        options: a dict of XLA option name to a bool, int, float or str value, such
            as `{"xla_cpu_enable_fast_math": False}`; None for none.

    Returns:
        dict: the options, as every program's compile call receives them.

    Raises:
        ConfigError: not a dict, a key or value of the wrong type, or options XLA
            refuses (its message included).

    Examples:
        >>> check_compile_options(None)
        {}
    """
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


def check_split_counts(split_sizes: Mapping[str, int]) -> None:
    """Refuse a split with no batches, before any is read.

    An empty train split has nothing to train on; an empty val split would leave
    every checkpoint unscored and the monitor watching nothing, silently.
    """
    for name, count in split_sizes.items():
        if count > 0:
            continue
        if name == "train":
            why = "training would run no step"
        elif name == "val":
            why = (
                "validation would score nothing, so no checkpoint would be ranked and "
                "the monitor would watch no metric"
            )
        else:
            why = "evaluating it would score nothing"
        raise ConfigError(
            f"Split `{name}` has no batches (len() is 0): {why}. Give it batches "
            f"(is its batch size larger than its sample count, with the partial "
            f"batch dropped?), or leave the split out of build_data."
        )


def check_probe_size(name: str, size: int, which: str = "first") -> None:
    """Refuse a probed batch of size 0: it trains or scores nothing, and a program
    compiled for it would be compiled again for the next batch."""
    if size == 0:
        raise ConfigError(
            f"The {which} batch of split `{name}` holds 0 samples (axis 0 of its "
            f"fields is 0). Every batch needs at least one sample: drop empty "
            f"batches in the source."
        )


def check_eval_fields(
    name: str, batch: Mapping[str, Any], hooks: Iterable[HookFields]
) -> None:
    """Refuse a split whose probed batch lacks a field an eval hook needs, naming
    the split: found now, not when the split is first evaluated (after an epoch)."""
    keys = tuple(batch)
    for fields in hooks:
        try:
            fields.select(keys)
        except RoutingError as error:
            raise RoutingError(f"Split `{name}` cannot be evaluated: {error}") from None


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
            cached.append(owned_copy(source))  # training donates params
        return cached[0]

    return provide
