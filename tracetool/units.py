"""Durations as every surface prints them (the CLI, the TUI, the reports, probe and sweep): one
rounding rule, one switch to seconds, and :data:`tracetool.glyphs.NOT_MEASURED` for a value that
was not measured. The surfaces differ only in the variant they ask for (digits, sign, a bare number
in a column headed ``ms``, µs for sub-0.1 ms values on screen), never in how a number is rounded."""

from __future__ import annotations

import math
from decimal import ROUND_HALF_UP, Decimal

from tracetool.glyphs import NOT_MEASURED


def fixed(x: float, digits: int, sign: bool = False) -> str:
    """``x`` with ``digits`` decimals, halves rounded up from its shortest repr.

    The JSON holds values already rounded (680.65); formatting them with ``%.1f``
    would round the binary double (680.6499...) down and disagree with text made
    from the unrounded value (680.7). Rounding the decimal repr keeps them equal.
    """
    d = Decimal(repr(float(x))).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP)
    if d == 0:
        d = abs(d)
    return f"{d:+}" if sign else str(d)


def number(x: float | None, digits: int = 0) -> str:
    """A count or a rate with thousands separators (``1,204``, ``35.07``); ``NOT_MEASURED`` for None."""
    return NOT_MEASURED if x is None else f"{x:,.{digits}f}"


def share(x: float | None) -> str:
    """A 0..1 fraction as a percentage with one decimal (``23.4 %``), rounded as :func:`fixed`;
    ``NOT_MEASURED`` for None. The reports', the CLI's and diff's one share formatter."""
    return NOT_MEASURED if x is None else f"{fixed(x * 100, 1)} %"


def ms(x: float | None, digits: int | None = None, *, unit: bool = True, sign: bool = False,
       micro: bool = False) -> str:
    """Milliseconds for people; ``NOT_MEASURED`` for None or NaN.

    Args:
        x: milliseconds.
        digits: decimals; None picks them by size (2 below 10 ms, 1 from 10 ms, 0 from 1,000 ms
            when no unit is written): ``4.64 ms``, ``161.0 ms``.
        unit: write the unit, switching to seconds from 1,000 ms (``1.23 s``); False gives the bare
            number, for a column whose header says ``ms``.
        sign: a ``+`` before a positive value (a change).
        micro: below 0.1 ms, microseconds (``50.0 µs``: the screens, where 0.05 ms reads as zero).
    """
    if x is None or math.isnan(x):
        return NOT_MEASURED
    plus = "+" if sign and x > 0 else ""
    if unit and abs(x) >= 1000:
        return f"{plus}{fixed(x / 1000, 2)} s"
    if unit and micro and 0 < abs(x) < 0.1:
        return f"{plus}{fixed(x * 1000, 1)} µs"
    if digits is None:
        digits = 2 if abs(x) < 10 else 1 if abs(x) < 1000 else 0
    return f"{plus}{fixed(x, digits)}{' ms' if unit else ''}"


__all__ = ["fixed", "ms"]
