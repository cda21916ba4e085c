"""``tracetool diff A B``: two traces of one workload side by side, and what moved.

For each latency metric (TTFT, ITL, TPOT, e2e) the p50 and p95 of A and B with
the CI gate's comparison (:func:`tracetool.report.gate.compare`: percentile
bootstrap, requests resampled as units, the ``[report]`` defaults). For each
component of the attribution, its time **per request** (its sum over requests
÷ the requests with an e2e, so the components add up to mean e2e) and its share
of e2e, in A and B, with a bootstrap interval of the change in ms per request
(the same resampling: requests as units, 2,000 resamples, seed 0, 95 %). ``top``
names the component that moved most; ``headline`` says it in one line, e.g.
``+18 % p95 TTFT, all in queue`` (docs/cli.md). For the tails (the requests above
p95 and above p99 of each run, the analysis' ``tail`` object) ``tail`` compares the
two runs' tail requests component by component: which component moved the tail,
which the headline adds when the figure that moved most is a p95 or p99.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tracetool import units
from tracetool.errors import TracetoolError
from tracetool.glyphs import NOT_MEASURED
from tracetool.report import fmt
from tracetool.report.budget import METRICS, Settings
from tracetool.report.gate import Comparison, Side, compare
from tracetool.report.stats import resample_counts
from tracetool.report.tail import TAIL_METRICS, TAIL_STATS, moved, tail_of
from tracetool.schema import COMPONENTS
from tracetool.untrusted import echo, shown

FORMAT = "tracetool-diff"
VERSION = 1
STATS = ("p50", "p95", "p99")
#: A component holding at least this share of the e2e change is where it went ("all in", "mostly in").
ALL_IN, MOSTLY_IN = 0.8, 0.5


@dataclass
class _Side:
    label: str
    path: str
    doc: dict[str, Any]
    side: Side
    #: per component, its ms in each successful request with an e2e (0 where that request did not measure it)
    per_request: dict[str, np.ndarray]
    measured: set[str]


def _load(path: str | os.PathLike[str], role: str) -> _Side:
    import analyzers
    from tracetool.report.build import Run, samples_of

    prefix = "A: " if role == "a" else "B: "
    try:
        a = analyzers.analyze(analyzers.load_traces(Path(path)))
    except TracetoolError as e:
        raise type(e)(prefix + str(e)) from e
    doc = a.to_json()
    run = Run(label=a.label, doc=doc, samples=samples_of(a))
    rows = [r for r in a.rows("attribution_requests") if r["ok"] and r["e2e_ms"] is not None]
    rows.sort(key=lambda r: (r["trace"], r["request_id"]))
    per = {c: np.asarray([r.get(f"{c}_ms") or 0.0 for r in rows], dtype=np.float64) for c in COMPONENTS}
    measured = {c for c, v in doc["components"].items() if v["measured"]}
    return _Side(label=a.label, path=str(path), doc=doc, side=run.side(), per_request=per, measured=measured)


def diff(a_path: str | os.PathLike[str], b_path: str | os.PathLike[str], *, settings: Settings | None = None
         ) -> dict[str, Any]:
    """The diff document (``format: tracetool-diff``, version 1) of trace A (before) and B (after)."""
    s = settings or Settings()
    a, b = _load(a_path, "a"), _load(b_path, "b")
    latency = []
    for mi, metric in enumerate(METRICS):
        for cmp in compare(a.side, b.side, metric, list(STATS), s, seed=(s.seed, mi)):
            latency.append(_comparison(cmp))
    comps: list[dict[str, Any]] = []
    for ci, c in enumerate(COMPONENTS):
        if c not in a.measured and c not in b.measured:
            continue
        va, vb = a.per_request[c], b.per_request[c]
        ms_a = float(va.mean()) if len(va) and c in a.measured else None
        ms_b = float(vb.mean()) if len(vb) and c in b.measured else None
        delta = ms_b - ms_a if ms_a is not None and ms_b is not None else None
        low = high = None
        if delta is not None and len(va) >= s.min_requests and len(vb) >= s.min_requests:
            low, high = _delta_interval(va, vb, s, seed=(s.seed, 100 + ci))
        share_a, share_b = a.doc["components"][c]["share"], b.doc["components"][c]["share"]
        comps.append({"component": c, "a_ms": _r(ms_a, 3), "b_ms": _r(ms_b, 3), "delta_ms": _r(delta, 3),
                      "ci_low_ms": _r(low, 3), "ci_high_ms": _r(high, 3),
                      "significant": low is not None and high is not None and (low > 0 or high < 0),
                      "a_share": _r(share_a, 4), "b_share": _r(share_b, 4),
                      "delta_share": _r(share_b - share_a, 4) if share_a is not None and share_b is not None
                      else None})
    changed = [c for c in comps if c["delta_ms"] is not None]
    top = max(changed, key=lambda m: abs(m["delta_ms"]))["component"] if changed else None
    doc = {"format": FORMAT, "version": VERSION,
           "a": {"label": a.label, "path": a.path, "requests": a.doc["requests"], "bottleneck": a.doc["bottleneck"]},
           "b": {"label": b.label, "path": b.path, "requests": b.doc["requests"], "bottleneck": b.doc["bottleneck"]},
           "settings": {"confidence": s.confidence, "bootstrap": s.bootstrap, "seed": s.seed,
                        "min_requests": s.min_requests},
           "latency": latency, "components": comps, "top": top, "tail": _tails(a.doc, b.doc)}
    doc["headline"] = headline(doc)
    return doc


def _tails(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """Per metric and tail (p95, p99) both runs explain: the two tail groups and, per component, its
    mean per tail request in A and B, the component that moved most first."""
    out = []
    for metric in TAIL_METRICS:
        for stat in TAIL_STATS:
            ga, gb = tail_of(a.get("tail"), metric, stat), tail_of(b.get("tail"), metric, stat)
            if ga is None or gb is None:
                continue
            m = moved(ga, gb)
            out.append({"metric": metric, "stat": stat, "a_requests": ga["n"], "b_requests": gb["n"],
                        "a_gap_ms": _r(ga["gap_ms"], 3), "b_gap_ms": _r(gb["gap_ms"], 3),
                        "top": m[0]["component"] if m else None,
                        "components": [{k: (_r(v, 3) if isinstance(v, float) else v) for k, v in x.items()}
                                       for x in m]})
    return out


def _delta_interval(va: np.ndarray, vb: np.ndarray, s: Settings, seed: tuple[int, int]) -> tuple[float, float]:
    """Percentile-bootstrap interval of mean(B) − mean(A), each side resampled by request."""
    rng = np.random.default_rng(list(seed))
    diffs = np.empty(s.bootstrap)
    step = 250  # resample in blocks: a (resamples x requests) count matrix per block, never all at once
    for i in range(0, s.bootstrap, step):
        k = min(step, s.bootstrap - i)
        wa, wb = resample_counts(len(va), k, rng), resample_counts(len(vb), k, rng)
        diffs[i:i + k] = (wb @ vb) / len(vb) - (wa @ va) / len(va)
    alpha = (1 - s.confidence) / 2
    low, high = np.quantile(diffs, [alpha, 1 - alpha])
    return float(low), float(high)


def _comparison(c: Comparison) -> dict[str, Any]:
    iv = c.interval
    delta = (c.candidate / c.baseline - 1) * 100 if c.baseline and c.candidate is not None else None
    return {"metric": c.metric, "stat": c.stat, "a_ms": _r(c.baseline, 3), "b_ms": _r(c.candidate, 3),
            "delta_pct": _r(delta, 2), "ci_low_pct": _r(iv.low * 100, 2) if iv else None,
            "ci_high_pct": _r(iv.high * 100, 2) if iv else None,
            "significant": iv is not None and (iv.low > 0 or iv.high < 0), "note": c.note}


def headline(doc: dict[str, Any]) -> str:
    """``+18 % p95 TTFT, all in queue``: the latency figure that moved most (significant ones first),
    and where the change in mean e2e went."""
    lat = [x for x in doc["latency"] if x["delta_pct"] is not None]
    if not lat:
        return "no latency figure measured in both traces"
    best = max(lat, key=lambda x: (x["significant"], abs(x["delta_pct"])))
    said = f"{best['delta_pct']:+.0f} % {best['stat']} {fmt.METRIC_NAMES.get(best['metric'], best['metric'])}"
    if not best["significant"]:
        said += " (not significant)"
    tail = next((t for t in doc.get("tail") or [] if (t["metric"], t["stat"]) == (best["metric"], best["stat"])
                 and t["top"] is not None), None)
    in_tail = ""
    if tail is not None:
        t = tail["components"][0]
        what = "in time no component measures" if t["component"] == "unattributed" else f"in {t['component']}"
        in_tail = f"; its tail moved most {what} ({units.ms(t['delta_ms'], sign=True)} per tail request)"
    top = next((c for c in doc["components"] if c["component"] == doc["top"]), None)
    if top is None:
        return said + "; where it went is not measured in both traces" + in_tail
    # shares of the movement (each component's change, whatever its sign): with changes of both signs the
    # signed sum can be near zero, and a share of it said "all in" of a component that another offset
    moved = [c for c in doc["components"] if c["delta_ms"] is not None]
    total = sum(abs(c["delta_ms"]) for c in moved)
    part = abs(top["delta_ms"]) / total if total else 0.0
    where = ("all in" if part >= ALL_IN else "mostly in" if part >= MOSTLY_IN else "most in") + f" {top['component']}"
    offset = max((c for c in moved if c["delta_ms"] * top["delta_ms"] < 0), key=lambda c: abs(c["delta_ms"]),
                 default=None)
    by = ""
    if offset is not None and abs(offset["delta_ms"]) >= (1 - ALL_IN) * total:
        by = f", offset by {offset['component']} ({units.ms(offset['delta_ms'], sign=True)})"
    return f"{said}, {where} ({units.ms(top['delta_ms'], sign=True)} per request){by}{in_tail}"


def _r(x: float | None, d: int) -> float | None:
    return None if x is None else round(float(x), d)


def print_diff(doc: dict[str, Any]) -> None:
    a, b = doc["a"], doc["b"]
    echo(f"A {shown(a['label'])} ({a['requests']} requests) -> B {shown(b['label'])} ({b['requests']} requests)")
    echo(doc["headline"])
    echo("")
    echo(f"{'latency':<12}{'A':>11}{'B':>11}{'change':>9}  {'interval':<18}")
    for x in doc["latency"]:
        ci = (NOT_MEASURED if x["ci_low_pct"] is None else f"{x['ci_low_pct']:+.1f} .. {x['ci_high_pct']:+.1f} %")
        ch = NOT_MEASURED if x["delta_pct"] is None else f"{x['delta_pct']:+.1f} %"
        name = f"{x['stat']} {fmt.METRIC_NAMES.get(x['metric'], x['metric'])}"
        echo(f"{name:<12}{units.ms(x['a_ms'], 2, unit=False):>11}{units.ms(x['b_ms'], 2, unit=False):>11}{ch:>9}  "
             f"{ci}{' *' if x['significant'] else ''}")
    echo("")
    echo(f"{'component':<13}{'A ms/req':>10}{'B ms/req':>10}{'change':>11}  {'interval (ms)':<22}{'share A -> B'}")
    for c in doc["components"]:
        ch = _change(c["delta_ms"])
        ci = NOT_MEASURED if c["ci_low_ms"] is None else f"{_change(c['ci_low_ms'])} .. {_change(c['ci_high_ms'])}"
        sh = f"{fmt.share(c['a_share'])} -> {fmt.share(c['b_share'])}"
        mark = " <- top" if c["component"] == doc["top"] else ""
        echo(f"{c['component']:<13}{units.ms(c['a_ms'], 2, unit=False):>10}{units.ms(c['b_ms'], 2, unit=False):>10}"
             f"{ch:>11}  {ci:<22}{sh}{mark}")
    if doc.get("tail"):
        echo("")
        echo(f"{'tail':<12}{'requests A/B':>14}  {'component':<13}{'A ms/req':>10}{'B ms/req':>10}{'change':>11}")
        for t in doc["tail"]:
            name = f"{t['stat']} {fmt.METRIC_NAMES.get(t['metric'], t['metric'])}"
            counts = f"{t['a_requests']}/{t['b_requests']}"
            for i, c in enumerate(t["components"][:3]):
                echo(f"{name if i == 0 else '':<12}{counts if i == 0 else '':>14}  {c['component']:<13}"
                     f"{units.ms(c['a_ms'], 2, unit=False):>10}{units.ms(c['b_ms'], 2, unit=False):>10}"
                     f"{_change(c['delta_ms']):>11}")


def _change(x: float | None) -> str:
    return units.ms(x, 2, unit=False, sign=True)


