"""What ``tracetool probe`` (and ``tracetool demo``, before the analysis) print: metrics, failures.

``probe_report`` is the documented ``--json`` object (``version`` 1); the text
form prints the same numbers. Where the time went is the analyzers' to say
(``tracetool analyze``), never computed a second way here.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from tracetool.serving.metrics import Timing, format_table, latency_metrics, stats
from tracetool.serving.probe import ProbeResult

LABELS = {"ttft_ms": "TTFT (ms)", "tpot_ms": "TPOT (ms)", "itl_ms": "ITL (ms)", "e2e_ms": "e2e (ms)",
          "network_ms": "network (ms)", "connect_ms": "TCP connect (ms)", "queue_ms": "server queue (ms)",
          "prefill_ms": "server prefill (ms)", "decode_ms": "server decode (ms)"}
#: Round trips whose sum bounds a streamed request's network time from above, for the report's
#: client-only evidence (the same default as analyze's network_bound_round_trips threshold).
BOUND_ROUND_TRIPS = 10


def probe_report(result: ProbeResult) -> dict[str, Any]:
    """The probe's numbers as one JSON-able object."""
    rs = result.results
    ok = [r for r in rs if r.ok]
    timings = [Timing(r.start_ns, r.token_ns, r.last_chunk_ns or r.end_ns, r.output_tokens) for r in ok]
    metrics: dict[str, Any] = latency_metrics(timings)
    net = [(r.end_ns - r.start_ns) / 1e6 - r.server_timing["server"] for r in ok
           if r.server_timing and "server" in r.server_timing]
    metrics["network_ms"] = stats(net)
    connects = [r.connect for r in rs if r.connect] + ([result.setup_connect] if result.setup_connect else [])
    metrics["connect_ms"] = stats((c[1] - c[0]) / 1e6 for c in connects)
    for phase in ("queue", "prefill", "decode"):  # what the server said it spent (its clock)
        metrics[f"{phase}_ms"] = stats(r.server_timing[phase] for r in ok
                                       if r.server_timing and phase in r.server_timing)
    out_tokens = sum(t.tokens for t in timings)
    errors = Counter(r.error for r in rs if r.error)
    sources = Counter(src for r in ok for src in r.timing_sources)
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
        "retried": sum(1 for r in rs if r.retry),
        "server_timings": dict(sources.most_common()),
        "network_bound": _network_bound(metrics),
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
    for src, n in rep["server_timings"].items():
        print(f"server timings: {src} on {n} of {rep['ok']} ok requests (durations on the server's clock)")
    if not rep["metrics"]["network_ms"]["n"] and rep["ok"]:
        b = rep["network_bound"]
        if b is not None:
            print(f"network: not measured per request (the server reports no total time); TCP connect "
                  f"p50 {b['rtt_ms']:.3g} ms bounds it: network >= 1 RTT = {_pct(b['rtt_share'])} of "
                  f"e2e, {b['round_trips']} round trips would be {_pct(b['bound_share'])}")
        else:
            print("network: not measured (the server reports no total time: run tracetool's middleware "
                  "in it, send its OTLP spans to tracetool receive, or merge its trace)")
    if rep["retried"]:
        print(f"retried x{rep['retried']}: a pooled connection was closed before any response byte; "
              "sent again once on a new connection")
    for e in rep["errors"]:
        print(f"failed x{e['count']}: {e['error']}")


def _pct(x: float) -> str:
    v = x * 100
    return f"{v:.0f} %" if v >= 10 else f"{v:.1f} %" if v >= 1 else f"{v:.2g} %"


def _network_bound(metrics: dict[str, Any]) -> dict[str, Any] | None:
    """Client-only evidence on the network: the median TCP handshake (one RTT) against mean e2e."""
    c, e = metrics["connect_ms"], metrics["e2e_ms"]
    if not c["n"] or not e["n"] or not e["mean"]:
        return None
    rtt = c["p50"]
    return {"basis": "tcp-connect", "rtt_ms": rtt, "connections": c["n"], "round_trips": BOUND_ROUND_TRIPS,
            "rtt_share": rtt / e["mean"], "bound_share": BOUND_ROUND_TRIPS * rtt / e["mean"]}
