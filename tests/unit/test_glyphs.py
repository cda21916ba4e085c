"""How every text output words a percentile estimated from histogram buckets (tracetool.glyphs)."""

from __future__ import annotations

from tracetool.glyphs import NOT_MEASURED, bucketed_percentile, bucketed_percentiles


def ms(x: float | None) -> str:
    return NOT_MEASURED if x is None else f"{x:g} ms"


def test_each_percentile_says_what_the_buckets_allow() -> None:
    # capped at what the sum and count allow: only the bound is known
    assert bucketed_percentile("p50", 0.06, 0.06, ms) == "p50 ≤ 0.06 ms"
    # Prometheus's interpolation, under its bucket's edge
    assert bucketed_percentile("p50", 233.0, 500.0, ms) == "p50 ≈ 233 ms (≤ 500 ms)"
    # in the +Inf bucket with nothing above it: the highest finite bound is a floor
    assert bucketed_percentile("p95", 60000.0, None, ms) == "p95 ≥ 60000 ms"
    # no finite bucket to interpolate in, but the sum bounds it
    assert bucketed_percentile("p50", None, 400.0, ms) == "p50 ≤ 400 ms"
    assert bucketed_percentile("p50", None, None, ms) == f"p50 {NOT_MEASURED}"


def test_a_times_object_reads_as_one_phrase() -> None:
    times = {"mean": 0.03, "p50": 0.06, "p95": 0.6, "n": 24, "bucketed": True, "p50_max": 0.06, "p95_max": 0.6}
    assert bucketed_percentiles(times, ms) == "p50 ≤ 0.06 ms, p95 ≤ 0.6 ms (from buckets)"
