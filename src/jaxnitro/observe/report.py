"""Reports a handle prints: the binding report, the frozen values, the stale check.

The binding report says where every configured value bound (a keyword, the experiment's
method or field, or the default) and what the data looked like. The frozen-values
report is `repr(nitro)`. The stale-handle report appears when a hook or a scalar
accessor was redefined after the handle froze it:

    jaxnitro: MyExp has values fixed at construction that have since been redefined...
      ! `accum()` was redefined: it returned 2 at construction and returns 4 now. ...
      ! hooks were redefined after this `Nitro` was built (loss). ...
"""

from __future__ import annotations

import logging
import sys
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import StaleHandleWarning

_REPORT_ENABLED = True


def set_config_report(enabled: bool) -> bool:
    """Switch the stale-handle report on or off; returns the previous setting."""
    global _REPORT_ENABLED
    previous = _REPORT_ENABLED
    _REPORT_ENABLED = bool(enabled)
    return previous


def _show(value: Any) -> str:
    if isinstance(value, str):  # paths and names are shown whole
        return value
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def binding_report(
    experiment_name: str,
    settings: Mapping[str, tuple[Any, str]],
    splits: Mapping[str, int],
    routing: Mapping[str, Sequence[str]],
    notes: Sequence[str] = (),
) -> str:
    """Where each run value bound, the splits found, and the routed batch fields.

    `settings` maps each run value's name to (value, where it came from).
    """
    lines = [f"jaxnitro binding report for {experiment_name}"]
    width = max((len(name) for name in settings), default=0)
    for name, (value, source) in settings.items():
        lines.append(f"  {name:<{width}}  {_show(value):<24} from {source}")
    if splits:
        shown = ", ".join(f"{name} ({count} batches)" for name, count in splits.items())
        lines.append(f"  data: {shown}")
    for hook, fields in routing.items():
        lines.append(f"  {hook} receives: {', '.join(fields) or 'no batch fields'}")
    lines.extend(f"  {note}" for note in notes)
    return "\n".join(lines)


def frozen_values(values: Mapping[str, Any]) -> str:
    """One line of the values a handle fixed at construction."""
    return "   ".join(f"{name} {_show(value)}" for name, value in values.items())


def stale_report(
    experiment_name: str,
    accessor_changes: Mapping[str, tuple[Any, Any]],
    redefined_hooks: Sequence[str],
) -> str | None:
    """The stale-handle report text, or None when nothing changed."""
    if not accessor_changes and not redefined_hooks:
        return None
    lines = [
        f"jaxnitro: {experiment_name} has values fixed at construction that have "
        f"since been redefined. This handle keeps what it froze; rebuild the `Nitro` "
        f"to pick up the new ones, and see `repr(nitro)` for what it is currently "
        f"holding."
    ]
    for name, (then, now) in accessor_changes.items():
        lines.append(
            f"  ! `{name}()` was redefined: it returned {_show(then)} at construction "
            f"and returns {_show(now)} now. This handle still uses {_show(then)}; "
            f"rebuild to pick up {_show(now)}."
        )
    if redefined_hooks:
        lines.append(
            f"  ! hooks were redefined after this `Nitro` was built "
            f"({', '.join(redefined_hooks)}). It will keep running the programs it was "
            f"built with; rebuild the `Nitro` to pick up the new code. The compile "
            f"cache is module-level, so a rebuild recompiles only what changed."
        )
    return "\n".join(lines)


def show_report(title: str, text: str) -> None:
    """Show a report: a rich panel on an interactive terminal; elsewhere a log
    record when a logging handler shows INFO records of `jaxnitro`, else the text on
    stderr, so a log file (`> train.log`, nohup, SLURM) keeps it beside the epoch
    lines. `progress_reporter(None)` silences the stderr copy with the rest of the
    plain-text output. Only rank 0 of a run across processes shows it.

    The same text goes to the logger's `log_other` either way (the caller's job), so
    a run's record holds it wherever the process ran.
    """
    from ..devices.distributed import is_rank0
    from .progress import current_progress_reporter, progress_bar_reporter
    from .progress_bar import is_terminal_session
    from .progress_log import is_log_shown

    if is_terminal_session():
        from rich.console import Console
        from rich.panel import Panel

        panel = Panel(text, title=title, expand=False)
        if not progress_bar_reporter.print_above(panel):
            Console(stderr=True).print(panel)
        return
    logger = logging.getLogger("jaxnitro")
    if is_log_shown(logger):
        logger.info("%s\n%s", title, text)
    elif current_progress_reporter() is not None and is_rank0():
        stream = sys.stderr
        if stream is not None:  # pythonw: no stderr at all
            stream.write(text + "\n")
            stream.flush()


def frozen_table(title: str, values: Mapping[str, Any], status: str) -> Any:
    """The frozen values as a rich renderable (what `repr(nitro)` shows as text)."""
    from rich.table import Table

    table = Table(title=title, show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    for name, value in values.items():
        table.add_row(name, _show(value))
    table.caption = status
    return table


def emit_stale_report(text: str | None) -> None:
    """Warn with the stale-handle report, unless switched off."""
    if text is not None and _REPORT_ENABLED:
        warnings.warn(text, StaleHandleWarning, stacklevel=3)
