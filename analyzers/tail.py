"""The ``tail`` object of ``analyze --json``: the tail against typical requests, per metric.

It reads the summary tables of ``analyzers/tail.sql`` (``tail_groups``, ``tail_components``,
``tail_features``, ``tail_summary``); nothing is computed here but the JSON's shape
(docs/analysis-json.md, "tail").
"""

from __future__ import annotations

import math
from typing import Any

#: The metrics whose tail is explained, in the order they are shown.
METRICS = ("ttft", "e2e", "tpot", "itl")
#: The tails compared with the typical requests (p40 to p60).
LEVELS = ("p95", "p99")


def _num(x: Any) -> float | None:
    if x is None:
        return None
    f = float(x)
    return None if math.isnan(f) or math.isinf(f) else f


def tail_json(groups: list[dict[str, Any]], components: list[dict[str, Any]], features: list[dict[str, Any]],
              summary: list[dict[str, Any]], min_requests: float) -> dict[str, Any] | None:
    """The ``tail`` object from those tables' rows; None when no metric has a typical group.
    ``min_requests``: the threshold tail_min_requests (a smaller tail is shown, never explained)."""
    by_metric = {r["metric"]: r for r in summary}
    if not by_metric:
        return None
    out: dict[str, Any] = {"min_requests": int(min_requests)}
    for m in METRICS:
        s = by_metric.get(m)
        if s is None:
            out[m] = None
            continue
        gs = {g["level"]: g for g in groups if g["metric"] == m}
        typ = gs.get("typical") or {}
        body: dict[str, Any] = {
            "n": s["n"],
            "explained": s["level"],
            "sentence": s["sentence"],
            "top_component": s["top_component"],
            "top_share": _num(s["top_share"]),
            "separating": s["separating"],
            "features_text": s["features_text"],
            "sampled_every": typ.get("sampled_every"),
            "typical": _group(typ, m),
        }
        for level in LEVELS:
            g = gs.get(level)
            if g is None:
                body[level] = None
                continue
            level_body = {**_group(g, m), "gap_ms": _num(g["gap_ms"]),
                          "components": {c["component"]: {
                              "measured": bool(c["measured"]), "typical_ms": _num(c["typical_ms"]),
                              "tail_ms": _num(c["tail_ms"]), "delta_ms": _num(c["delta_ms"]),
                              "gap_share": _num(c["gap_share"])}
                              for c in components if c["metric"] == m and c["level"] == level}}
            if m != "itl":
                level_body["features"] = [_feature(f) for f in features if f["metric"] == m and f["level"] == level]
            body[level] = level_body
        out[m] = body
    return out


def _group(g: dict[str, Any], metric: str) -> dict[str, Any]:
    out = {"lo_ms": _num(g.get("lo_ms")), "hi_ms": _num(g.get("hi_ms")), "n": g.get("n", 0),
           "mean_ms": _num(g.get("mean_ms"))}
    if metric == "itl":
        out.update(first_gap_share=_num(g.get("first_gap_share")), with_prefill_share=_num(g.get("with_prefill_share")),
                   preempted_share=_num(g.get("preempted_share")))
    return out


def _feature(f: dict[str, Any]) -> dict[str, Any]:
    return {"feature": f["feature"], "label": f["label"], "kind": f["kind"], "tail_n": f["tail_n"],
            "typical_n": f["typical_n"], "tail_mean": _num(f["tail_mean"]), "typical_mean": _num(f["typical_mean"]),
            "tail_median": _num(f["tail_median"]), "typical_median": _num(f["typical_median"]),
            "ratio": _num(f["ratio"]), "cliffs_delta": _num(f["cliffs_delta"]), "p_value": _num(f["p_value"]),
            "separates": bool(f["separates"]), "rank": f["rank"]}


__all__ = ["LEVELS", "METRICS", "tail_json"]
