"""`gpt`'s chunked cross-entropy (`GPT(loss_chunks=...)`, `gpt :loss-chunks`): the
head and the loss computed a chunk of positions at a time, so that the whole
logits [batch, time, vocab] never exist at once.

At GPT-2 small (batch 16, context 1024, vocabulary 50304) the logits are 824M
numbers: 3.3 GB in float32, and as much again for their gradient. With
`loss_chunks=n` a training forward pass stops before the head and returns
`ChunkedLogits`: the head's input (the final norm's output, [batch, time, dim]) and
the head's weight [dim, vocab]. `token_cross_entropy` then cuts the positions into
`n` chunks of time / n and, for each in turn (`jax.lax.map`), multiplies it by the
head in the compute dtype, casts the logits to float32 and takes the softmax
cross-entropy of each position, exactly the operations the whole-logits path does
(`optax.softmax_cross_entropy_with_integer_labels` of the float32 logits). Each
chunk is rematerialised (`jax.checkpoint`): the forward pass keeps only its input,
and the backward pass computes its logits again, so one chunk's logits and their
gradient are alive at a time, 1/n of the whole. The price is the head's product
once more in the backward pass (about 2 d V FLOPs a token, 1/3 of the head's).

The loss and the gradient are the whole-logits path's up to rounding (a sum taken
in another order). The option changes the training program only: the fronts call
`GPT.loss_logits` when `jaxnitro.training()` is true (the run file's `gpt`,
examples/gpt2.py's `forward`), which gives `ChunkedLogits`; evaluation, prediction
and export call `GPT.__call__`, which always gives the logits.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax

BAD_LOSS_CHUNKS = (
    "{owner} must be 0 (off) or a positive integer dividing the context {context}, "
    "got {value!r}: it is the number of chunks the training loss cuts the positions "
    "into, computing the head's logits one chunk at a time. Pass a divisor of "
    "{context}, e.g. {example}, or 0 for the whole logits at once."
)
"""The message of a `loss_chunks` that is not 0 or a divisor of the context;
`owner` names the field or argument, `example` the divisor nearest the value."""

UNEVEN_CHUNKS = (
    "{owner} is {chunks}: it cuts the positions of a training batch into {chunks} "
    "chunks, but this batch has {time} positions, which {chunks} does not divide. "
    "Train on windows of a length {chunks} divides (the model's whole context is "
    "one), or pass a loss_chunks dividing {time}, e.g. {example}."
)
"""The message of a training batch whose positions the chunks do not divide."""


def divisor_near(value: int, total: int) -> int:
    """The divisor of `total` nearest `value` (the smaller of two as near)."""
    divisors = [d for d in range(1, total + 1) if total % d == 0]
    return min(divisors, key=lambda d: (abs(d - value), d))


def check_loss_chunks(value: object, context: int, owner: str, example: str) -> int:
    """`value` if it is 0 or a positive integer dividing `context`.

    Args:
        value: the number of chunks asked for.
        context: the positions the model holds (its position table's rows).
        owner: how the message names the field or argument, e.g.
            "GPT(loss_chunks=...)".
        example: the field written with a value, with `{}` where the value goes,
            e.g. "loss_chunks={}".

    Raises:
        ValueError: BAD_LOSS_CHUNKS, naming `owner`, the value and a divisor.
    """
    asked = value if isinstance(value, int) and not isinstance(value, bool) else -1
    if asked == 0 or (asked > 0 and context % asked == 0):
        return asked
    near = divisor_near(asked if asked > 0 else 4, context)
    raise ValueError(
        BAD_LOSS_CHUNKS.format(
            owner=owner, context=context, value=value, example=example.format(near)
        )
    )


def check_chunked_time(time: int, chunks: int, owner: str, example: str) -> None:
    """Refuse a training batch of `time` positions that `chunks` does not divide.

    Raises:
        ValueError: UNEVEN_CHUNKS.
    """
    if chunks and time % chunks:
        raise ValueError(
            UNEVEN_CHUNKS.format(
                owner=owner,
                chunks=chunks,
                time=time,
                example=example.format(divisor_near(chunks, time)),
            )
        )


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["hidden", "kernel"],
    meta_fields=["chunks", "compute"],
)
@dataclasses.dataclass(frozen=True)
class ChunkedLogits:
    """The logits of a `GPT` head, held as the head's input and weight, for
    `token_cross_entropy` to compute a chunk at a time (a pytree: the arrays are
    its leaves, `chunks` and `compute` its static data).

    `compute` is the dtype the head multiplies in, fixed when the forward pass made
    this value: a bf16 run casts the outputs of `forward` to float32 before the loss
    reads them, and the loss casts the two arrays back (exactly: bfloat16 ->
    float32 -> bfloat16 loses nothing), so the head's product is the one the
    whole-logits path computes.
    """

    hidden: jax.Array
    """float[batch, time, dim]: the final norm's output, the head's input."""
    kernel: jax.Array
    """float[dim, vocab]: the head's weight."""
    chunks: int
    """How many chunks of time / chunks positions the loss computes in turn."""
    compute: str
    """The name of the dtype the head multiplies in ("float32", "bfloat16")."""

    @property
    def logits_shape(self) -> tuple[int, int, int]:
        """The shape of the logits this value stands for: (batch, time, vocab).
        (Not `shape`: the run file takes a value with a shape for an array.)"""
        batch, time, _ = self.hidden.shape
        return batch, time, self.kernel.shape[1]

    @property
    def kind(self) -> str:
        """What the run file's messages call it (`values.kind_of`)."""
        return (
            f"the logits {list(self.logits_shape)} of `gpt :loss-chunks "
            f"{self.chunks}` in training, which only `cross-entropy` reads"
        )

    def __str__(self) -> str:
        """The run file's form (`values.show`): its kind, not its tracers."""
        return f"<{self.kind}>"

    def logits(self) -> jax.Array:
        """The whole logits float[batch, time, vocab] in the compute dtype, what
        `GPT.__call__` gives (for a loss that needs them: it costs their memory)."""
        return _head(self.hidden.astype(self.compute), self.kernel.astype(self.compute))


def _head(hidden: jax.Array, kernel: jax.Array) -> jax.Array:
    """[..., dim] x [dim, vocab] -> [..., vocab]: `nnx.Linear`'s product."""
    return jax.lax.dot_general(hidden, kernel, (((hidden.ndim - 1,), (0,)), ((), ())))


def token_cross_entropy(logits: Any, targets: jax.Array) -> jax.Array:
    """The softmax cross-entropy of each position.

    Args:
        logits: float[batch, time, vocab] (any leading axes for an array), or
            `ChunkedLogits` standing for them.
        targets: int[batch, time]: the class of each position.

    Returns:
        float[batch, time]: `optax.softmax_cross_entropy_with_integer_labels` of the
        logits; float32 for `ChunkedLogits`, whose chunks are computed one at a
        time and recomputed in the backward pass (see the module doc).

    Raises:
        ValueError: `ChunkedLogits` whose chunks do not divide the positions.

    Example (every logit equal: each loss is log 3, to a TPU's exp and log):

        >>> import jax.numpy as jnp
        >>> head = ChunkedLogits(jnp.ones((1, 4, 2)), jnp.ones((2, 3)), 2, "float32")
        >>> losses = token_cross_entropy(head, jnp.zeros((1, 4), jnp.int32))
        >>> losses.shape, round(float(losses[0, 3]), 3)
        ((1, 4), 1.099)
    """
    with jax.named_scope("loss"):  # named for profiles (`nn_modules.Attention`)
        return _cross_entropy(logits, targets)


def _cross_entropy(logits: Any, targets: jax.Array) -> jax.Array:
    """`token_cross_entropy`'s computation."""
    if not isinstance(logits, ChunkedLogits):
        return optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    batch, time, dim = logits.hidden.shape
    chunks = logits.chunks
    check_chunked_time(time, chunks, "ChunkedLogits.chunks", "chunks={}")
    size = time // chunks
    compute = logits.compute
    hidden = logits.hidden.astype(compute)
    # The head's weight stays float32 outside the loop and is cast inside it, so
    # that the backward pass sums its chunks' gradients in float32. A bfloat16 sum
    # rounds once a chunk: measured on the tiny model in bf16 at 64 chunks, the
    # head's gradient was 4.9e-2 (of its largest entry) off the whole-logits
    # one with it, 3.8e-3 (the rounding of one bfloat16 product) without.
    kernel = logits.kernel.astype(jnp.promote_types(logits.kernel.dtype, jnp.float32))
    # Chunk-major: [chunks, batch, size, ...], the axis lax.map walks.
    pieces = (
        hidden.reshape(batch, chunks, size, dim).swapaxes(0, 1),
        targets.reshape(batch, chunks, size).swapaxes(0, 1),
    )

    # The chunk's loss keeps only its inputs for the backward pass, which computes
    # the logits again. prevent_cse is off: inside a loop XLA cannot merge the
    # recomputation into the forward pass (the loop body is one iteration's).
    @functools.partial(jax.checkpoint, prevent_cse=False)
    def chunk_losses(piece: tuple[jax.Array, jax.Array]) -> jax.Array:
        part, labels = piece
        part_logits = _head(part, kernel.astype(compute)).astype(jnp.float32)
        return optax.softmax_cross_entropy_with_integer_labels(part_logits, labels)

    losses = jax.lax.map(chunk_losses, pieces)  # float32[chunks, batch, size]
    return losses.swapaxes(0, 1).reshape(batch, time)
