"""The ``engine`` object of ``analyze --json``, and the engine-metrics fill-ins of components.

Both read the summary tables of ``analyzers/engine.sql`` (``engine_summary``,
``engine_stats``); nothing is computed here but the JSON's shape
(docs/analysis-json.md).
"""

from __future__ import annotations

import math
from typing import Any

#: Server components an engine's time histograms can stand in for, by concept prefix.
FILLABLE = ("queue", "prefill", "decode", "tokenize")
#: The ``basis`` of a component filled from engine metrics (never a per-request measurement).
BASIS = "engine-metrics"


def _num(x: Any) -> float | None:
    if x is None:
        return None
    f = float(x)
    return None if math.isnan(f) or math.isinf(f) else f


def _times(row: dict[str, Any], concept: str) -> dict[str, Any] | None:
    """A time histogram's window figures. Its percentiles come from buckets (``bucketed``): each
    ``pNN`` is an estimate no greater than ``pNN_max``, the most the buckets, sum and count allow."""
    mean = _num(row.get(f"{concept}_ms_mean"))
    if mean is None:
        return None
    return {"mean": mean, "p50": _num(row.get(f"{concept}_ms_p50")), "p95": _num(row.get(f"{concept}_ms_p95")),
            "n": row.get(f"{concept}_n"), "bucketed": True, "p50_max": _num(row.get(f"{concept}_ms_p50_max")),
            "p95_max": _num(row.get(f"{concept}_ms_p95_max"))}


def engine_json(summary: list[dict[str, Any]], stats: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The ``engine`` object for an analysis holding these ``engine_summary``/``engine_stats`` rows:
    None when no trace has engine metrics, or when several do (each trace's own object says)."""
    if len(summary) != 1:
        return None
    r = summary[0]
    preemptions = _num(r.get("preemptions"))
    return {
        "source": r.get("source"),
        "clock": r.get("clock"),
        "window_s": _num(r.get("window_s")),
        "scrapes": r.get("scrapes"),
        "series": r.get("series"),
        "requests_waiting": {"mean": _num(r.get("requests_waiting_mean")), "max": _num(r.get("requests_waiting_max"))},
        "requests_running": {"mean": _num(r.get("requests_running_mean")), "max": _num(r.get("requests_running_max"))},
        "kv_cache_usage": {"mean": _num(r.get("kv_cache_usage_mean")), "max": _num(r.get("kv_cache_usage_max"))},
        "preemptions": None if preemptions is None else round(preemptions),
        "prefix_cache_hit_rate": _num(r.get("prefix_cache_hit_rate")),
        "queue_time_ms": _times(r, "queue_time"),
        "prefill_time_ms": _times(r, "prefill_time"),
        "decode_time_ms": _times(r, "decode_time"),
        "tokenize_time_ms": _times(r, "tokenize_time"),
        "baseline": bool(r.get("baseline", True)),
        "evidence": {s["concept"]: s["series"] for s in stats},
    }


def fill_components(components: dict[str, dict[str, Any]], engine: dict[str, Any] | None,
                    e2e_mean_ms: float | None) -> None:
    """Fill server components no per-request span measured with the engine's window means.

    A filled component keeps ``measured: false`` and gains ``"basis": "engine-metrics"``:
    a mean over the engine's window, not a per-request measurement. Its share is that mean
    over mean e2e."""
    if engine is None:
        return
    for comp in FILLABLE:
        t = engine.get(f"{comp}_time_ms")
        if not t or t.get("mean") is None:
            continue
        cur = components.get(comp)
        if cur is not None and cur.get("measured"):
            continue  # per-request spans exist: they win
        share = t["mean"] / e2e_mean_ms if e2e_mean_ms else None
        components[comp] = {"ms": t["mean"], "share": share, "measured": False, "requests": t.get("n") or 0,
                            "basis": BASIS, "series": engine["evidence"].get(f"{comp}_time")}
