"""How every line the framework prints writes a number: one rule, in one place.

The progress line, the per-epoch lines, the history table, the plot's titles and the
smoke report all write their numbers through `format_number`, and durations through
`format_seconds` (a table cell, an epoch line) or `format_clock` (an ETA). So a
metric reads the same wherever it appears: `train_loss 2.439`, `val acc 1.0`,
`2.1 s`.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

SIGNIFICANT = 4
"""Significant digits of a float."""
PLAIN_LOW = 1e-4
"""Floats below this (in magnitude, but not 0) are written with an exponent."""
PLAIN_HIGH = 1e15
"""Floats at or above this are written with an exponent."""


def format_number(value: Any) -> str:
    """A number as every printed line writes it.

    An integer (Python or NumPy) is written whole. A float gets four significant
    digits without trailing zeros, but keeps one decimal, so a float never reads
    as an integer (`1.0`, not `1`); from 1000 up, every digit left of the point is
    kept and the decimals go (`12346`); below 1e-4 it takes an exponent. NaN and
    the infinities read `nan`, `inf`, `-inf`; a bool or a non-number is `str()`.

    Examples:
        >>> [format_number(v) for v in (2.43912, 1.0, 0.19469, 0.5, 0.0, 120)]
        ['2.439', '1.0', '0.1947', '0.5', '0.0', '120']
        >>> [format_number(v) for v in (999.96, 1234.5, 12345.6, -0.041683, 1.2e-4)]
        ['1000', '1234', '12346', '-0.04168', '0.00012']
        >>> [format_number(v) for v in (3.2e-6, 3e-6, 2.5e17)]
        ['3.2e-06', '3e-06', '2.5e+17']
        >>> [format_number(v) for v in (float("nan"), float("-inf"), True, "x")]
        ['nan', '-inf', 'True', 'x']
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return str(value)
    if isinstance(value, numbers.Integral):
        return str(int(value))
    x = float(value)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0.0:
        return "0.0"
    magnitude = abs(x)
    if magnitude < PLAIN_LOW or magnitude >= PLAIN_HIGH:
        mantissa, exponent = f"{x:.{SIGNIFICANT - 1}e}".split("e")
        return f"{mantissa.rstrip('0').rstrip('.')}e{exponent}"
    rounded = float(f"{x:.{SIGNIFICANT}g}")
    if abs(rounded) >= 1000:
        return f"{x:.0f}"
    return repr(rounded)  # the shortest text of the rounded value: "1.0", "0.1947"


def format_seconds(seconds: float) -> str:
    """A duration in seconds, to a tenth: `0.2`, `2.1`, `125.0` (NaN: `nan`).

    Examples:
        >>> [format_seconds(s) for s in (0.19469, 2.06, 125.0)]
        ['0.2', '2.1', '125.0']
    """
    return "nan" if math.isnan(seconds) else f"{seconds:.1f}"


def format_clock(seconds: float) -> str:
    """A longer duration as a clock, `m:ss` or `h:mm:ss` (an ETA, a run's time).

    Examples:
        >>> [format_clock(s) for s in (5.4, 65, 3600 * 26 + 61)]
        ['0:05', '1:05', '26:01:01']
    """
    total = max(int(round(seconds)), 0)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{minutes}:{secs:02d}"
