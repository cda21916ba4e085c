"""Fixed number formatting for every report format, so the bytes of a report are stable."""

from __future__ import annotations

import math
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from tracetool.glyphs import NOT_MEASURED

#: Display names of the latency metrics.
METRIC_NAMES = {"ttft": "TTFT", "itl": "ITL", "tpot": "TPOT", "e2e": "e2e"}


def ms(x: float | None) -> str:
    """Milliseconds for people: ``1.23 s``, ``161.0 ms``, ``4.64 ms``; ``NOT_MEASURED`` when not measured."""
    if x is None:
        return NOT_MEASURED
    if abs(x) >= 1000:
        return f"{fixed(x / 1000, 2)} s"
    if abs(x) >= 10:
        return f"{fixed(x, 1)} ms"
    return f"{fixed(x, 2)} ms"


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


def limit_ms(x: float) -> str:
    """A budget as written (``500 ms``, ``12.5 ms``)."""
    return f"{x:g} ms"


def pct(x: float | None, sign: bool = True) -> str:
    """A percentage given in percent: ``+5.3 %``; ``NOT_MEASURED`` when unknown."""
    if x is None:
        return NOT_MEASURED
    return f"{fixed(x, 1, sign)} %"


def share(x: float | None) -> str:
    """A fraction shown as a percentage: ``23.4 %``."""
    return NOT_MEASURED if x is None else f"{fixed(x * 100, 1)} %"


def stat_name(stat: str, metric: str) -> str:
    """``p95 TTFT``, ``mean ITL``."""
    return f"{stat} {METRIC_NAMES.get(metric, metric)}"


def rnd(x: Any, digits: int) -> float | None:
    """A float for JSON with a fixed number of decimals; None for missing, NaN or infinite."""
    if x is None:
        return None
    f = float(x)
    if math.isnan(f) or math.isinf(f):
        return None
    r = round(f, digits)
    return 0.0 if r == 0 else r  # no "-0.0"


__all__ = ["METRIC_NAMES", "fixed", "limit_ms", "ms", "pct", "rnd", "share", "stat_name"]
