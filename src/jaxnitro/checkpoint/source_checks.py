"""`check_source`: the shape of a weights or resume source, checked before anything
is built, refused with the form to use instead."""

from __future__ import annotations

import os
from typing import Any

from ..errors import ConfigError, NotYetSupportedError
from ..handle_type import RunHandle
from .averaging import Average
from .selectors import Best, Last, is_selector


def is_nitro(value: Any) -> bool:
    """Whether `value` is a live run handle (a `Nitro`)."""
    return isinstance(value, RunHandle)


def _spelled(what: str, source: Any) -> str:
    return f"{what}={source!r}"


def normalize_which(which: Any) -> Any:
    if isinstance(which, Best) and which.k == 1 and which.among is None:
        return "best"
    if isinstance(which, Last) and which.n == 1:
        return "latest"
    return which


def check_source(source: Any, what: str, *, restore_optimizer: bool = False) -> None:
    """Refuse a checkpoint source of the wrong shape before anything is built.

    The shapes `weights=` and `resume=` take: None, a path, or a `(run, which)`
    pair, where run is "latest", "all", a run id or a Nitro, and which is "best",
    "latest", "current" (a handle's in-memory state) or an `Average`. `weights`
    also takes a bare Nitro; `resume` takes False and "auto". A refusal names the
    form to use instead (a bare "best" names no run, say).

    Args:
        source: the source as the user gave it.
        what: "weights", "resume" or how another caller names it ("restore_best").
        restore_optimizer: whether the weights load restores the optimizer state
            too (an in-memory handle source cannot).

    Raises:
        ConfigError: a source of the wrong shape, with the form to use.

    Examples:
        >>> check_source(("latest", "best"), "weights")
        >>> check_source("best", "weights")
        Traceback (most recent call last):
        ...
        jaxnitro.errors.ConfigError: weights="best" is ambiguous about the run: ...
    """
    if source is None or (what == "resume" and (source is False or source == "auto")):
        return
    if isinstance(source, str | os.PathLike):
        text = os.fspath(source)
        if text in ("best", "latest"):
            raise ConfigError(
                f'{what}="{text}" is ambiguous about the run: use a pair such as '
                f'{what}=("latest", "{text}") for the newest run\'s {text} record.'
            )
        if text == "current":
            raise ConfigError(
                f'{what}="current" needs a handle: pass {what}=other or '
                f'{what}=(other, "current") with a Nitro named other.'
            )
        return
    if is_nitro(source):
        _check_handle_source(source, what, restore_optimizer)
        return
    if isinstance(source, Average) or is_selector(source):
        raise ConfigError(
            f"{_spelled(what, source)} names no run: write a pair such as "
            f'{what}=("latest", {source!r}).'
        )
    if not (isinstance(source, tuple) and len(source) == 2):
        raise ConfigError(
            f"{what}= takes a checkpoint path or a (run, which) pair such as "
            f'("latest", "best"); got {source!r}.'
        )
    run, which = source[0], normalize_which(source[1])
    if not (is_nitro(run) or isinstance(run, str)):
        raise ConfigError(
            f'{what}=({run!r}, {source[1]!r}): the run is "latest", "all", "legacy", '
            f"a run id (see jaxnitro.runs(run_dir)) or a Nitro."
        )
    if which == "current":
        if not is_nitro(run):
            raise ConfigError(
                f'{what}=({run!r}, "current"): "current" is a handle\'s in-memory '
                f'state, so the run must be a Nitro: {what}=(other, "current").'
            )
        _check_handle_source(run, what, restore_optimizer)
        return
    if run == "all" and which == "latest":
        raise ConfigError(
            f'{what}=("all", "latest") is ("latest", "latest"): the newest record of '
            f"all is the newest run's newest record. Write that."
        )
    if isinstance(which, Average):
        _check_average_source(run, which, what, restore_optimizer)
        return
    if is_selector(which):
        raise ConfigError(
            f"{what}=({run!r}, {which!r}): this selector may pick several "
            f"checkpoints, so a source takes it only inside Average: "
            f"{what}=({run!r}, Average({which!r})). Best(1) and Last(1) are "
            f'"best" and "latest".'
        )
    if which not in ("best", "latest"):
        raise ConfigError(
            f'{what}=({run!r}, {which!r}): which is "best", "latest", '
            f'"current" (with a Nitro) or Average(selector).'
        )


def _check_handle_source(handle: Any, what: str, restore_optimizer: bool) -> None:
    if what == "resume":
        raise NotYetSupportedError(
            'resume= from a live handle (other or (other, "current")), a '
            "continuation from memory, is not supported yet. Resume from its newest "
            'checkpoint: resume=(other, "latest").'
        )
    if restore_optimizer:
        raise ConfigError(
            "restore_optimizer=True needs a checkpoint record; restoring a live "
            "handle's optimizer is not supported yet. Pass weights=(other, "
            '"latest") to read its newest record instead.'
        )


def _check_average_source(
    run: Any, average: Average, what: str, restore_optimizer: bool
) -> None:
    if what == "resume":
        raise ConfigError(
            f"resume=({run!r}, {average!r}): a resume continues one record exactly, "
            f"optimizer included, and an average has no optimizer state. Load it as "
            f"weights=({run!r}, {average!r}) instead."
        )
    if restore_optimizer:
        raise ConfigError(
            f"restore_optimizer=True with {what}=({run!r}, {average!r}): an average "
            f"has no optimizer state; the optimizer starts fresh. Drop "
            f"restore_optimizer."
        )
    if run == "all":
        raise ConfigError(
            f'{what}=("all", {average!r}): averaging across runs is refused for now; '
            f'name one run, e.g. ("latest", {average!r}) or a run id.'
        )
