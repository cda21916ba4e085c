"""Build a report: analyse the trace (and the baseline), extract samples, run the gate.

The analysis is :func:`analyzers.analyze` — attribution, percentiles, findings
and claims are never recomputed here. What this module adds is the per-request
samples the bootstrap resamples (``attribution_requests`` for TTFT, TPOT and
e2e; ``tokens_gaps`` for ITL, each token keyed by its request) and the
versioned JSON document every renderer reads (docs/ci-reports.md).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracetool.errors import BadInput, TracetoolError
from tracetool.report import fmt
from tracetool.report.budget import COMPONENTS, METRICS, Budget
from tracetool.report.gate import GateResult, Side, evaluate
from tracetool.report.stats import Sample
from tracetool.schema import shown_components
from tracetool.slo import SLO

if TYPE_CHECKING:
    from analyzers.options import AnalysisOptions

FORMAT = "tracetool-report"
VERSION = 1
_STAT_KEYS = ("mean", "p50", "p90", "p95", "p99")


@dataclass
class Run:
    """One analysed trace as the report sees it.

    Attributes:
        label: the trace's label (its directory name; ``all`` for a directory of traces).
        doc: the analysis' JSON document (docs/analysis-json.md).
        samples: per metric (``ttft``, ``itl``, ``tpot``, ``e2e``), the values with their requests.
        source: the tool a trace was imported from (``vllm-bench``...), None when recorded.
    """

    label: str
    doc: dict[str, Any]
    samples: Mapping[str, Sample]
    source: str | None = None
    warnings: list[str] = field(default_factory=list)
    #: the :class:`analyzers.Analysis` itself, for what the document does not hold (the HTML page's figures)
    analysis: Any = None

    def side(self) -> Side:
        """The gate's view, with numbers rounded as the JSON shows them (ms to 3 decimals, shares to
        4), so every message and every format is computed from the same figures."""
        latency = {m: {k: (fmt.rnd(v, 3) if k in _STAT_KEYS else v) for k, v in self.doc[f"{m}_ms"].items()}
                   for m in METRICS}
        components = {c: {**v, "ms": fmt.rnd(v["ms"], 3), "share": fmt.rnd(v["share"], 4)}
                      for c, v in self.doc["components"].items()}
        return Side(label=self.label, latency=latency, components=components, samples=self.samples,
                    slo=self.doc.get("slo"), tail=self.doc.get("tail"))


def analyse(path: str | os.PathLike[str], options: AnalysisOptions | None = None, *, role: str = "trace",
            slo: SLO | None = None, **option_fields: Any) -> Run:
    """Analyse one trace, or a dataset (a directory tree of traces), for the report, with ``options``
    (or its fields as keywords, :func:`analyzers.analyze`).

    Raises:
        BadInput: not a trace, or nothing to report (no request, or every request failed); the
            message starts with ``baseline:`` for the baseline.
        UsageError: an unknown preset or claim.
    """
    import analyzers  # DuckDB is loaded only when a report is built
    from tracetool.dataset import discover, open_members

    prefix = "baseline: " if role == "baseline" else ""
    try:
        # a dataset (a tree of traces) is read forgivingly: unreadable traces are skipped and named
        ds = discover([Path(path)])
        opened = open_members(ds)
        traces = opened.trace_list()
        labels = [m.label for m, _ in opened.traces] if ds.is_tree else None
        a = analyzers.analyze(traces, options, labels=labels, **option_fields)
    except TracetoolError as e:
        if not prefix:
            raise
        raise type(e)(prefix + str(e)) from e
    doc = a.to_json()
    if slo is not None:
        doc["slo"] = a.slo(slo)
    if doc["requests"] and doc["requests"] == doc["failed_requests"]:
        raise BadInput(f"{prefix}{path}: all {doc['requests']} requests failed: no latency to report")
    sources = sorted({str(t.meta.get("import", {}).get("tool")) for t in traces
                      if isinstance(t.meta.get("import"), dict) and t.meta["import"].get("tool")})
    return Run(label=a.label, doc=doc, samples=LazySamples(a), source=", ".join(sources) or None,
               warnings=[*(doc.get("warnings") or []), *(f"{m.path}: skipped: {why}" for m, why in opened.bad)],
               analysis=a)


def samples_of(a: Any) -> dict[str, Sample]:
    """Per metric, the values the analysis' percentiles are over, keyed by request.

    TTFT, TPOT and e2e: one value per successful request (``attribution_requests``).
    ITL: one value per token gap of successful requests (``tokens_gaps``), each
    tagged with its request so the bootstrap resamples requests, not tokens.
    """
    # In a fixed order: the analyzers' tables come in DuckDB's parallel order, and the seeded
    # bootstrap resamples by position, so an unordered input would move its intervals run to run.
    req: pa.Table = a.table("attribution_requests")
    req = req.filter(pc.equal(req["ok"], True)).sort_by([("trace", "ascending"), ("request_id", "ascending")])
    out = {m: Sample.of(_floats(req[f"{m}_ms"])) for m in ("ttft", "tpot", "e2e")}
    gaps = a.query("SELECT request_key, itl_ms FROM tokens_gaps WHERE NOT failed "
                   "ORDER BY trace, request_id, index")
    out["itl"] = Sample.of(_floats(gaps["itl_ms"]), gaps["request_key"].to_numpy())
    return {m: out[m] for m in METRICS}


class LazySamples(Mapping[str, Sample]):
    """:func:`samples_of` an analysis, read when a metric's sample is first asked for.

    Only a comparison with a baseline bootstraps samples; a report without one (the usual
    ``report TRACE --html``) never reads them. The ITL sample is every token gap in request order:
    on a 1M-token trace that ordered read cost a third of the analysis, on every report."""

    def __init__(self, analysis: Any) -> None:
        self._analysis = analysis
        self._samples: dict[str, Sample] | None = None

    def _read(self) -> dict[str, Sample]:
        if self._samples is None:
            self._samples = samples_of(self._analysis)
        return self._samples

    def __getitem__(self, metric: str) -> Sample:
        return self._read()[metric]

    def __iter__(self) -> Iterator[str]:
        return iter(METRICS)

    def __len__(self) -> int:
        return len(METRICS)


def _floats(col: pa.ChunkedArray) -> np.ndarray:
    arr = pc.cast(col, pa.float64()).fill_null(float("nan"))
    return np.asarray(arr.to_numpy(), dtype=np.float64)


@dataclass
class Report:
    """A built report: the runs, the budget it was checked against, the gate's result."""

    trace: Run
    baseline: Run | None
    budget: Budget
    gate: GateResult

    @property
    def passed(self) -> bool:
        return not self.gate.failed

    def failing_lines(self) -> list[str]:
        """One line per failed check: what the CLI prints on stderr."""
        return [f"FAIL {c.key}: {c.message}" for c in self.gate.failed]

    def to_json(self) -> dict[str, Any]:
        """The versioned document (``format: tracetool-report``, ``version: 1``; docs/ci-reports.md)."""
        checks = self.gate.checks
        counts = {k: sum(c.status == k for c in checks) for k in ("pass", "warn", "fail", "skip")}
        s = self.budget.settings
        d = self.trace.doc
        return {
            "format": FORMAT,
            "version": VERSION,
            "passed": self.passed,
            "summary": {"checks": len(checks), "passed": counts["pass"], "warned": counts["warn"],
                        "failed": counts["fail"], "skipped": counts["skip"]},
            "trace": _run_info(self.trace),
            "baseline": _run_info(self.baseline) if self.baseline else None,
            "settings": {"budget": Path(self.budget.source).name if self.budget.source else None,
                         "tolerance_pct": s.tolerance_pct, "confidence": s.confidence,
                         "bootstrap": s.bootstrap, "seed": s.seed, "min_requests": s.min_requests,
                         "default_checks": s.default_checks, "unmeasured": s.unmeasured},
            "headline": d.get("headline"),
            "bottleneck": d.get("bottleneck"),
            "latency": _latency(d),
            "baseline_latency": _latency(self.baseline.doc) if self.baseline else None,
            "components": {c: {"ms": fmt.rnd(v["ms"], 3), "share": fmt.rnd(v["share"], 4),
                               "measured": bool(v["measured"]), "requests": v["requests"],
                               # a component filled from the engine's metrics says so (analyze --json)
                               **({"basis": v["basis"]} if v.get("basis") else {})}
                           for c, v in shown_components(d["components"]).items() if c in COMPONENTS},
            "comparison": None if self.baseline is None else [_comparison(c) for c in self.gate.comparisons],
            "checks": [_check(c) for c in checks],
            "findings": [dict(f) for f in d.get("findings", [])],
            "claims": [{**c, "share": fmt.rnd(c.get("share"), 4)} for c in d.get("claims", [])],
            **({"slo": d["slo"]} if d.get("slo") else {}),
        }


def build_report(trace: Run, baseline: Run | None = None, budget: Budget | None = None, *,
                 tolerance_pct: float | None = None) -> Report:
    """Run the gate over analysed runs (see :func:`analyse`).

    Raises:
        UsageError: the budget has relative limits but there is no baseline.
    """
    budget = budget or Budget()
    if tolerance_pct is not None:
        budget = replace(budget, settings=replace(budget.settings, tolerance_pct=tolerance_pct))
    gate = evaluate(trace.side(), baseline.side() if baseline else None, budget)
    return Report(trace=trace, baseline=baseline, budget=budget, gate=gate)


def _run_info(r: Run) -> dict[str, Any]:
    d = r.doc
    return {"label": r.label, "requests": d["requests"], "failed_requests": d["failed_requests"],
            "output_tokens": d["decode"].get("output_tokens"), "source": r.source}


def _latency(d: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for m in METRICS:
        p = d[f"{m}_ms"]
        out[m] = {"n": p["n"], "clock": p["clock"],
                  **{k: fmt.rnd(p[k], 3) for k in ("mean", "p50", "p90", "p95", "p99")}}
    return out


def _comparison(c: Any) -> dict[str, Any]:
    iv = c.interval
    return {"metric": c.metric, "stat": c.stat, "baseline_ms": fmt.rnd(c.baseline, 3),
            "candidate_ms": fmt.rnd(c.candidate, 3),
            "delta_pct": fmt.rnd(None if c.delta is None else c.delta * 100, 2),
            "ci_low_pct": fmt.rnd(iv.low * 100, 2) if iv else None,
            "ci_high_pct": fmt.rnd(iv.high * 100, 2) if iv else None,
            "change": c.change, "mann_whitney_p": fmt.rnd(c.mann_whitney_p, 4),
            "requests_baseline": c.requests_baseline, "requests_candidate": c.requests_candidate,
            "note": c.note}


def _check(c: Any) -> dict[str, Any]:
    digits = {"pct": 2, "ms": 3, "share": 4, "rps": 3}[c.unit]
    return {"id": c.id, "kind": c.kind, "key": c.key, "title": c.title, "status": c.status, "unit": c.unit,
            "value": fmt.rnd(c.value, digits), "limit": c.limit,
            "ci_low": fmt.rnd(c.ci_low, 2), "ci_high": fmt.rnd(c.ci_high, 2), "message": c.message,
            **({"tail": c.tail} if c.tail else {})}


__all__ = ["FORMAT", "VERSION", "LazySamples", "Report", "Run", "analyse", "build_report", "samples_of"]
