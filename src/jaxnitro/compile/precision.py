"""Mixed precision: the run keyword `precision`, and the casts around `forward`.

`precision="f32"` (the default) computes in the dtypes the parameters and batches
have. `precision="bf16"` runs the forward pass, and so its backward pass, in
bfloat16: the parameters, the batch's floating fields and the floating Device
fields are cast to bfloat16 as `forward` reads them, and its outputs are cast back
to float32 before `loss` and the metrics see them. The master weights, the
gradients (the derivative of a cast returns the parameter's own dtype), the
optimizer state, the EMA and the loss reduction stay float32; a model state the
forward pass updates (batch statistics) keeps its own dtypes. On a GPU or TPU this
halves activation memory and runs matrix products on the bfloat16 units; on a CPU
it is usually slower, since XLA emulates much of bfloat16 there.

The precision is part of every program's compile-cache key.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ..errors import ConfigError

# Each precision's compute dtype for `forward`; None computes as the values are.
PRECISIONS: dict[str, Any] = {"f32": None, "bf16": jnp.bfloat16}


def check_precision(value: Any) -> str:
    """`precision=`: one of PRECISIONS, refused otherwise with the choices."""
    if not isinstance(value, str) or value not in PRECISIONS:
        raise ConfigError(
            f"precision must be one of {', '.join(map(repr, PRECISIONS))}, got "
            f'{value!r}. "bf16" runs forward and backward in bfloat16 with float32 '
            f"master weights, optimizer state and loss."
        )
    return value


def compute_dtype(precision: str) -> Any:
    """The dtype `forward` computes in under `precision`, or None for as-is."""
    return PRECISIONS[precision]


def cast_floating(tree: Any, dtype: Any) -> Any:
    """`tree` with every floating-point array leaf cast to `dtype`; integer, bool
    and key leaves, and anything that is not an array, are left as they are."""

    def cast(leaf: Any) -> Any:
        leaf_dtype = getattr(leaf, "dtype", None)
        if leaf_dtype is not None and jnp.issubdtype(leaf_dtype, jnp.floating):
            return leaf.astype(dtype)
        return leaf

    return jax.tree.map(cast, tree)


def like_dtypes(new: Any, old: Any) -> Any:
    """`new` with each floating leaf cast back to the dtype of the matching leaf
    of `old` (a model state after a reduced-precision forward pass). When the two
    trees differ in structure, `new` is returned unchanged: the state checks name
    that mismatch elsewhere."""

    def back(n: Any, o: Any) -> Any:
        n_dtype, o_dtype = getattr(n, "dtype", None), getattr(o, "dtype", None)
        if n_dtype is None or o_dtype is None or n_dtype == o_dtype:
            return n
        if jnp.issubdtype(n_dtype, jnp.floating):
            return n.astype(o_dtype)
        return n

    try:
        return jax.tree.map(back, new, old)
    except ValueError:  # another structure: the state checks name it elsewhere
        return new
