"""Which component moved a tail: the report's and the diff's reading of the analysis' ``tail`` object.

A latency percentile that moved between two runs moved because its tail requests changed: the
requests above p95 (p99) of each run, against its typical requests (p40-p60), are the analysis'
``tail`` object (docs/analysis-json.md). What the gate and ``diff`` add is the comparison of the two
runs' tail groups, component by component, per tail request (nothing is recomputed here).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tracetool.report import fmt

#: The percentiles whose requests form a tail group in the analysis, and its metrics, in its order.
TAIL_STATS = ("p95", "p99")
TAIL_METRICS = ("ttft", "e2e", "tpot", "itl")
#: What the measured components leave of a tail's metric (module tail).
UNATTRIBUTED = "unattributed"


def tail_of(tail: Mapping[str, Any] | None, metric: str, stat: str) -> Mapping[str, Any] | None:
    """The tail group above ``stat`` (p95, p99) of ``metric`` in an analysis' ``tail`` object, when it has
    at least the analysis' ``min_requests`` members."""
    if stat not in TAIL_STATS or not tail:
        return None
    g = (tail.get(metric) or {}).get(stat)
    # a tail of fewer than tail_min_requests says nothing about where a tail's time goes
    return g if g and g["n"] >= tail.get("min_requests", 1) else None


def moved(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Between two runs' tail groups of one metric and percentile: per component measured in both, its
    mean per tail request in each and the change, largest change first ("unattributed" included: what
    no component measured)."""
    if not a or not b:
        return []
    out = []
    for name, cb in b["components"].items():
        ca = a["components"].get(name) or {}
        if not (cb.get("measured") and ca.get("measured")) or cb["tail_ms"] is None or ca["tail_ms"] is None:
            continue
        out.append({"component": name, "a_ms": ca["tail_ms"], "b_ms": cb["tail_ms"],
                    "delta_ms": cb["tail_ms"] - ca["tail_ms"]})
    return sorted(out, key=lambda x: -abs(x["delta_ms"]))


def where(group: Mapping[str, Any] | None, stat: str, metric: str) -> str | None:
    """One run's tail in words: ``its 10 requests above p99 take 518.8 ms more than typical ones (p40-p60):
    queue 101.4 %``."""
    if not group or group.get("gap_ms") is None:
        return None
    measured = [(c["gap_share"], n) for n, c in group["components"].items()
                if c["measured"] and n != UNATTRIBUTED and c["gap_share"] is not None]
    grew = sorted(((x, n) for x, n in measured if x >= 0.05), reverse=True)
    parts = (", ".join(f"{n} {fmt.share(x)}" for x, n in grew[:3]) if grew
             else "no measured component grew" if measured else "not split: no component of it is measured")
    unit = "gaps" if metric == "itl" else "requests"
    return (f"its {group['n']} {unit} above {stat} take {fmt.ms(group['gap_ms'])} more than typical ones "
            f"(p40-p60): {parts}")


def what_moved(base: Mapping[str, Any] | None, cand: Mapping[str, Any] | None, stat: str) -> str | None:
    """Between two runs, which component moved the tail above ``stat``, in words."""
    m = moved(base, cand)
    if not m:
        return None
    top = m[0]
    total = sum(x["delta_ms"] for x in m)
    of = f" of {_signed(total)}" if len(m) > 1 else ""
    what = ("in time no component measures" if top["component"] == UNATTRIBUTED
            else f"in {top['component']}")
    return (f"the {stat} tail moved most {what}: {fmt.ms(top['a_ms'])} -> {fmt.ms(top['b_ms'])} per tail "
            f"request ({_signed(top['delta_ms'])}{of})")


def _signed(x: float) -> str:
    return ("+" if x >= 0 else "") + fmt.ms(x)


__all__ = ["TAIL_METRICS", "TAIL_STATS", "moved", "tail_of", "what_moved", "where"]
