"""Batch-field routing: each hook receives exactly the batch fields it declares.

A hook declares fields as keyword parameters after its positional ones:

    def forward(self, model, params, state, *, img): ...     # gets `img` only
    def loss(self, outputs, *, label, weight=None): ...      # `weight` is optional
    def metrics(self, outputs, **batch): ...                 # gets every field

A required keyword missing from the batch raises naming the hook and the field; a
keyword with a default is optional; `**batch` receives everything unchecked. A field
no traced hook declares is never transferred to the device.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import HookError, RoutingError

# The positional parameters each hook takes before its batch fields, `self` included.
HOOK_POSITIONALS: dict[str, tuple[str, ...]] = {
    "forward": ("self", "model", "params", "state"),
    "loss": ("self", "outputs"),
    "metrics": ("self", "outputs"),
    "train_metrics": ("self", "outputs"),
    "train_step": ("self", "model", "params", "opt_state", "state"),
}


@dataclass(frozen=True)
class HookFields:
    """The batch fields one hook declares."""

    hook: str
    required: tuple[str, ...]
    optional: tuple[str, ...]
    takes_all: bool

    def select(self, available: Iterable[str]) -> tuple[str, ...]:
        """The fields this hook receives from a batch holding `available`."""
        available = tuple(available)
        if self.takes_all:
            return available
        missing = [name for name in self.required if name not in available]
        if missing:
            raise RoutingError(
                f"`{self.hook}` declares the batch field `{missing[0]}`, but the batch "
                f"has no such field. The batch has: "
                f"{', '.join(available) or 'nothing'}."
                f" Add `{missing[0]}` to the batches, or give the keyword a default in "
                f"`{self.hook}` to make it optional."
            )
        return self.required + tuple(n for n in self.optional if n in available)


def hook_fields(hook: str, fn: Callable[..., Any]) -> HookFields:
    """Read the batch fields `fn` declares after the positionals `hook` takes."""
    positionals = HOOK_POSITIONALS[hook]
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as error:
        raise HookError(f"Cannot read the signature of `{hook}`: {error}") from None
    params = list(signature.parameters.values())
    leading = [
        p
        for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        and p.default is p.empty
    ]
    if len(leading) < len(positionals) and not any(
        p.kind is p.VAR_POSITIONAL for p in params
    ):
        shown = ", ".join(positionals)
        raise HookError(
            f"`{hook}` must take the positional parameters ({shown}) before its batch "
            f"fields; its signature is {hook}{signature}. Declare batch fields as "
            f"keyword-only parameters after `*`: def {hook}({shown}, *, <fields>)."
        )
    required: list[str] = []
    optional: list[str] = []
    takes_all = False
    for index, p in enumerate(params):
        if p.kind is p.VAR_KEYWORD:
            takes_all = True
        elif p.kind in (p.VAR_POSITIONAL, p.POSITIONAL_ONLY) or (
            p.kind is p.POSITIONAL_OR_KEYWORD and index < len(positionals)
        ):
            continue
        elif p.default is p.empty:
            required.append(p.name)
        else:
            optional.append(p.name)
    return HookFields(hook, tuple(required), tuple(optional), takes_all)


def as_batch(batch: Any, hint: str) -> Mapping[str, Any]:
    """A batch as a mapping of field names to arrays; refuse anything else."""
    if type(batch) is dict or isinstance(batch, Mapping):
        return batch
    as_dict = getattr(batch, "_asdict", None)
    if callable(as_dict):
        return dict(as_dict())
    raise RoutingError(
        f"A batch must be a dict of named fields, got {type(batch).__name__}. {hint}"
    )
