"""Fixed number formatting for every report format, so the bytes of a report are stable (durations and
the rounding rule are tracetool.units', shared with every other surface)."""

from __future__ import annotations

import math
from typing import Any

from tracetool.glyphs import NOT_MEASURED
from tracetool.units import fixed, ms, share

#: Display names of the latency metrics.
METRIC_NAMES = {"ttft": "TTFT", "itl": "ITL", "tpot": "TPOT", "e2e": "e2e"}


def limit_ms(x: float) -> str:
    """A budget as written (``500 ms``, ``12.5 ms``)."""
    return f"{x:g} ms"


def pct(x: float | None, sign: bool = True) -> str:
    """A percentage given in percent: ``+5.3 %``; ``NOT_MEASURED`` when unknown."""
    if x is None:
        return NOT_MEASURED
    return f"{fixed(x, 1, sign)} %"


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
