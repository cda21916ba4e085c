"""What ``tracetool probe`` and ``tracetool demo`` print: metrics, failures, where the time went.

``probe_report`` is the documented ``--json`` object (``version`` 1); the text
form prints the same numbers. ``attribution`` applies the attribution rule of
docs/trace-format.md to a trace in plain Python, for the demo's summary when
the analyzers are not installed.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from tracetool.reader import Trace
from tracetool.schema import CLIENT_REQUEST, PHASES, SERVER_REQUEST
from tracetool.serving.metrics import Timing, format_table, latency_metrics, stats
from tracetool.serving.probe import ProbeResult

LABELS = {"ttft_ms": "TTFT (ms)", "tpot_ms": "TPOT (ms)", "itl_ms": "ITL (ms)", "e2e_ms": "e2e (ms)",
          "network_ms": "network (ms)", "connect_ms": "TCP connect (ms)"}


def probe_report(result: ProbeResult) -> dict[str, Any]:
    """The probe's numbers as one JSON-able object."""
    rs = result.results
    ok = [r for r in rs if r.ok]
    timings = [Timing(r.start_ns, r.token_ns, r.last_chunk_ns or r.end_ns, r.output_tokens) for r in ok]
    metrics: dict[str, Any] = latency_metrics(timings)
    net = [(r.end_ns - r.start_ns) / 1e6 - r.server_timing["server"] for r in ok
           if r.server_timing and "server" in r.server_timing]
    metrics["network_ms"] = stats(net)
    metrics["connect_ms"] = stats((r.connect[1] - r.connect[0]) / 1e6 for r in rs if r.connect)
    out_tokens = sum(t.tokens for t in timings)
    errors = Counter(r.error for r in rs if r.error)
    return {
        "version": 1,
        "url": result.base_url,
        "model": result.model,
        "endpoint": "chat" if result.chat else "completions",
        "requests": len(rs),
        "ok": len(ok),
        "failed": len(rs) - len(ok),
        "duration_s": result.wall_s,
        "request_throughput": len(ok) / result.wall_s if result.wall_s > 0 else None,
        "output_token_throughput": out_tokens / result.wall_s if result.wall_s > 0 else None,
        "output_tokens": out_tokens,
        "metrics": metrics,
        "errors": [{"error": e, "count": c} for e, c in errors.most_common(10)],
        "trace": None if result.out is None else str(result.out),
    }


def print_probe_report(rep: dict[str, Any]) -> None:
    dur = rep["duration_s"]
    print(f"{rep['url']}  model {rep['model']}  ({rep['endpoint']})")
    line = f"requests: {rep['ok']} ok, {rep['failed']} failed of {rep['requests']} in {dur:.2f} s"
    if rep["request_throughput"] is not None:
        line += (f"; {rep['request_throughput']:.2f} req/s, "
                 f"{rep['output_token_throughput']:.1f} output tok/s aggregate")
    print(line)
    rows = {k: v for k, v in rep["metrics"].items() if v["n"]}
    for ln in format_table(rows, LABELS):
        print(ln)
    if not rep["metrics"]["network_ms"]["n"] and rep["ok"]:
        print("network: not measured (the server sent no Server-Timing; run tracetool's middleware "
              "in it, or merge its trace)")
    for e in rep["errors"]:
        print(f"failed x{e['count']}: {e['error']}")


def attribution(trace: Trace) -> dict[str, Any]:
    """Per-component sums and shares over the trace's successful requests (the documented rule)."""
    failed = {r["request_id"] for r in trace.table("requests").to_pylist() if r.get("status") == "error"}
    dur: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    spans = trace.table("spans")
    for rid, name, s, e in zip(spans.column("request_id").to_pylist(), spans.column("name").to_pylist(),
                               spans.column("start_ns").to_pylist(), spans.column("end_ns").to_pylist(),
                               strict=True):
        if rid and rid not in failed:
            dur[rid][name] += e - s
    sums: dict[str, int] = defaultdict(int)
    measured: set[str] = set()
    e2e_total = 0
    for d in dur.values():
        c, s = d.get(CLIENT_REQUEST), d.get(SERVER_REQUEST)
        e2e = c if c is not None else s
        if e2e is None:
            continue
        e2e_total += e2e
        if c is not None and s is not None:
            sums["network"] += c - s
            measured.add("network")
        for ph in PHASES:
            if ph in d:
                sums[ph] += d[ph]
                measured.add(ph)
        if s is not None:
            sums["other"] += max(0, s - sum(d.get(ph, 0) for ph in PHASES))
            measured.add("other")
    comps = ("network", "queue", "tokenize", "preprocess", "prefill", "decode", "detokenize", "postprocess",
             "other")
    return {"requests": len(dur), "e2e_ms": e2e_total / 1e6,
            "components": {k: {"ms": sums[k] / 1e6 if k in measured else None,
                               "share": (sums[k] / e2e_total if e2e_total else None) if k in measured else None}
                           for k in comps}}


def print_attribution(att: dict[str, Any]) -> None:
    print(f"where the time went ({att['requests']} requests, sum of e2e {att['e2e_ms']:.0f} ms):")
    for name, v in att["components"].items():
        if v["share"] is None:
            continue
        bar = "#" * round(v["share"] * 40)
        print(f"  {name:<12}{v['share'] * 100:6.1f} %  {v['ms']:10.1f} ms  {bar}")
