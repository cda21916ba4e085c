"""What every text output (the CLI, the TUI, the reports) shows for a value the trace does not
measure, or measures only roughly: a null is unknown, never zero and never blank; a percentile
estimated from histogram buckets is never shown as precisely as a measured one. Each reads the
same everywhere."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

#: A value that is not measured (a null in the analysis). An en dash, not a hyphen, so it is
#: never read as a minus sign.
NOT_MEASURED = "–"
#: Said after percentiles estimated from a histogram's buckets (an engine's /metrics).
FROM_BUCKETS = "(from buckets)"


def bucketed_percentile(name: str, value: float | None, upper: float | None,
                        fmt: Callable[[float | None], str]) -> str:
    """One percentile estimated from buckets, by what is known of it (``fmt`` formats a number):
    ``p50 ≤ 0.06 ms`` when the estimate is its upper bound (the sum and count allow no more),
    ``p50 ≈ 233 ms (≤ 500 ms)`` when Prometheus's interpolation lies below the bound,
    ``p95 ≥ 60 s`` when it fell in the +Inf bucket with nothing bounding it."""
    if value is None:
        return f"{name} {NOT_MEASURED}" if upper is None else f"{name} ≤ {fmt(upper)}"
    if upper is None:
        return f"{name} ≥ {fmt(value)}"
    if value >= upper:
        return f"{name} ≤ {fmt(upper)}"
    return f"{name} ≈ {fmt(value)} (≤ {fmt(upper)})"


def bucketed_percentiles(times: Mapping[str, Any], fmt: Callable[[float | None], str],
                         keys: Sequence[str] = ("p50", "p95")) -> str:
    """The percentiles of an ``analyze --json`` times object with ``"bucketed": true`` (the
    ``engine`` object's ``queue_time_ms``...): ``p50 ≤ 0.06 ms, p95 ≤ 0.60 ms (from buckets)``."""
    parts = [bucketed_percentile(k, times.get(k), times.get(f"{k}_max"), fmt) for k in keys]
    return f"{', '.join(parts)} {FROM_BUCKETS}"


__all__ = ["FROM_BUCKETS", "NOT_MEASURED", "bucketed_percentile", "bucketed_percentiles"]
