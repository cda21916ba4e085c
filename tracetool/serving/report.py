"""What ``tracetool probe`` (and ``tracetool demo``, before the analysis) print: metrics, failures.

``probe_report`` is the documented ``--json`` object (``version`` 1); the text
form prints the same numbers. Where the time went is the analyzers' to say
(``tracetool analyze``), never computed a second way here.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from tracetool.glyphs import NOT_MEASURED
from tracetool.serving.metrics import format_table, latency_metrics, stats
from tracetool.serving.probe_types import ProbeResult
from tracetool.serving.schedule import (
    CLIENT_QUEUE_SHARE,
    CLIENT_RATE_RATIO,
    CPU_BOUND,
    LAG_LIMIT_MS,
)
from tracetool.slo import SLO
from tracetool.untrusted import NAME_LIMIT, echo, shown

LABELS = {"ttft_ms": "TTFT (ms)", "tpot_ms": "TPOT (ms)", "itl_ms": "ITL (ms)", "e2e_ms": "e2e (ms)",
          "network_ms": "network (ms)", "connect_ms": "TCP connect (ms)", "queue_ms": "server queue (ms)",
          "prefill_ms": "server prefill (ms)", "decode_ms": "server decode (ms)",
          "client_queue_ms": "client queue (ms)"}
#: Round trips whose sum bounds a streamed request's network time from above, for the report's
#: client-only evidence (the same default as analyze's network_bound_round_trips threshold).
BOUND_ROUND_TRIPS = 10


def probe_report(result: ProbeResult, slo: SLO | None = None) -> dict[str, Any]:
    """The probe's numbers as one JSON-able object (with ``slo``: goodput and attainment)."""
    rs = [r for r in result.results if not r.warmup]  # warm-up requests: recorded apart, not measured
    ok = [r for r in rs if r.ok]
    # latency counts from the intended send time where the run had a schedule (client_queue included)
    timings = [r.timing for r in ok]
    metrics: dict[str, Any] = latency_metrics(timings)
    net = [(r.end_ns - r.start_ns) / 1e6 - r.server_timing["server"] for r in ok
           if r.server_timing and "server" in r.server_timing]
    metrics["network_ms"] = stats(net)
    connects = [r.connect for r in rs if r.connect] + ([result.setup_connect] if result.setup_connect else [])
    metrics["connect_ms"] = stats((c[1] - c[0]) / 1e6 for c in connects)
    for phase in ("queue", "prefill", "decode"):  # what the server said it spent (its clock)
        metrics[f"{phase}_ms"] = stats(r.server_timing[phase] for r in ok
                                       if r.server_timing and phase in r.server_timing)
    metrics["client_queue_ms"] = stats((r.start_ns - r.intended_ns) / 1e6 for r in ok if r.intended_ns is not None)
    out_tokens = sum(t.tokens for t in timings)
    errors = Counter(r.error for r in rs if r.error)
    sources = Counter(src for r in ok for src in r.timing_sources)
    wall = max(1e-9, result.wall_s - result.config.warmup_s) if result.config.warmup_s else result.wall_s
    return {
        "version": 1,
        "url": result.base_url,
        "model": result.model,
        "endpoint": "chat" if result.chat else "completions",
        "requests": len(rs),
        "ok": len(ok),
        "failed": len(rs) - len(ok),
        "duration_s": wall,
        "request_throughput": len(ok) / wall if wall > 0 else None,
        "output_token_throughput": out_tokens / wall if wall > 0 else None,
        "output_tokens": out_tokens,
        "tokens": token_counts(ok),
        "workload": result.workload,
        "metrics": metrics,
        "errors": [{"error": e, "count": c} for e, c in errors.most_common(10)],
        "retried": sum(1 for r in rs if r.retry),
        "warmup_requests": len(result.results) - len(rs),
        "server_timings": dict(sources.most_common()),
        "network_bound": _network_bound(metrics),
        "client": client_health(result),
        "trace": None if result.out is None else str(result.out),
        "slo": None if slo is None else slo.evaluate(_slo_rows(rs), wall),
    }


def _slo_rows(rs: list[Any]) -> list[dict[str, Any]]:
    """Per request, what an SLO can bound (ms), from the intended send time like every figure here."""
    rows: list[dict[str, Any]] = []
    for r in rs:
        if not r.ok:
            rows.append({"ok": False})
            continue
        t = r.timing
        ttft = t.ttft_ns / 1e6 if t.ttft_ns is not None else None
        e2e = t.e2e_ns / 1e6
        n = len(r.token_ns)
        rows.append({"ok": True, "ttft_ms": ttft, "e2e_ms": e2e,
                     "tpot_ms": (e2e - ttft) / (t.tokens - 1) if ttft is not None and t.tokens > 1 else None,
                     "itl_ms": (r.token_ns[-1] - r.token_ns[0]) / 1e6 / (n - 1) if n > 1 else None})
    return rows


def print_probe_report(rep: dict[str, Any]) -> None:
    dur = rep["duration_s"]
    echo(f"{rep['url']}  model {shown(rep['model'], NAME_LIMIT)}  ({rep['endpoint']})")
    line = f"requests: {rep['ok']} ok, {rep['failed']} failed of {rep['requests']} in {dur:.2f} s"
    if rep["request_throughput"] is not None:
        line += (f"; {rep['request_throughput']:.2f} req/s, "
                 f"{rep['output_token_throughput']:.1f} output tok/s aggregate")
    echo(line)
    wl = rep.get("workload") or {}
    if wl.get("lengths"):
        echo(f"workload: {wl['source']}{' ' + wl['file'] if wl.get('file') else ''}; lengths {wl['lengths']}")
    tok = rep.get("tokens") or {}
    if tok.get("prompt") is not None:
        said = f"prompt tokens: {tok['prompt']:,} ({', '.join(f'{k} {v}' for k, v in tok['prompt_sources'].items())})"
        if tok.get("cached_prompt") is not None:
            said += f", {tok['cached_prompt']:,} from the server's prefix cache"
        if tok.get("reasoning") is not None:
            said += f"; reasoning tokens: {tok['reasoning']:,} of the output"
        echo(said)
    rows = {k: v for k, v in rep["metrics"].items() if v["n"]}
    for ln in format_table(rows, LABELS):
        echo(ln)
    for src, n in rep["server_timings"].items():
        echo(f"server timings: {src} on {n} of {rep['ok']} ok requests (durations on the server's clock)")
    if not rep["metrics"]["network_ms"]["n"] and rep["ok"]:
        b = rep["network_bound"]
        if b is not None:
            echo(f"network: not measured per request (the server reports no total time); TCP connect "
                  f"p50 {b['rtt_ms']:.3g} ms bounds it: network >= 1 RTT = {_pct(b['rtt_share'])} of "
                  f"e2e, {b['round_trips']} round trips would be {_pct(b['bound_share'])}")
        else:
            echo("network: not measured (the server reports no total time: run tracetool's middleware "
                  "in it, send its OTLP spans to tracetool receive, or merge its trace)")
    sl = rep.get("slo")
    if sl:
        said = ", ".join(f"{k} <= {v:g}" for k, v in sl["targets"].items())
        att = NOT_MEASURED if sl["attainment"] is None else f"{sl['attainment'] * 100:.1f} %"
        good = NOT_MEASURED if sl["goodput_rps"] is None else f"{sl['goodput_rps']:.2f} req/s"
        echo(f"SLO {said}: {sl['met_requests']} of {sl['requests']} requests met it ({att}), goodput {good}; "
              + ("met" if sl["met"] else f"NOT met (needs {sl['attainment_target'] * 100:g} %)"))
    cl = rep.get("client")
    if cl and cl["client_bound"]:
        echo(f"client-bound: {cl['client_bound']}")
    if rep["retried"]:
        echo(f"retried x{rep['retried']}: a pooled connection was closed before any response byte; "
              "sent again once on a new connection")
    for e in rep["errors"]:
        echo(f"failed x{e['count']}: {shown(e['error'])}")  # the server's words


def token_counts(ok: list[Any]) -> dict[str, Any]:
    """Totals over successful requests, and where the prompt counts came from: the server's
    ``usage`` (or its timings), ``--tokenizer``, or nowhere. Cached and reasoning tokens are the
    server's (null when it reports none); reasoning falls back to the reasoning chunks seen."""
    from tracetool.serving.probe_trace import prompt_tokens, reasoning_tokens

    sources = Counter("server" if r.prompt_tokens is not None or r.reported_prompt_tokens is not None
                      else "tokenizer" if r.local_prompt_tokens is not None else "unknown" for r in ok)
    prompts = [n for r in ok if (n := prompt_tokens(r)) is not None]
    cached = [r.cached_prompt_tokens for r in ok if r.cached_prompt_tokens is not None]
    reasoning = [n for r in ok if (n := reasoning_tokens(r)) is not None]
    return {"prompt": sum(prompts) if prompts else None, "prompt_sources": dict(sources.most_common()),
            "cached_prompt": sum(cached) if cached else None, "reasoning": sum(reasoning) if reasoning else None}


def client_health(result: ProbeResult) -> dict[str, Any]:
    """The load client's own account: offered vs achieved send rate, time requests waited in the
    client (client_queue), its event loop's lag and CPU, and a client-bound verdict naming the limit.
    The same rule as the ``client-bound`` finding of ``tracetool analyze`` (docs/findings.md)."""
    rs = [r for r in result.results if r.intended_ns is not None and r.start_ns and not r.warmup]
    ok = [r for r in rs if r.ok]
    offered = achieved = None
    if len(rs) >= 2:
        ints = [r.intended_ns or 0 for r in rs]
        sends = [r.start_ns for r in rs]
        if max(ints) > min(ints):
            offered = (len(rs) - 1) * 1e9 / (max(ints) - min(ints))
        if max(sends) > min(sends):
            achieved = (len(rs) - 1) * 1e9 / (max(sends) - min(sends))
    waits = [(r.start_ns - (r.intended_ns or 0)) / 1e6 for r in ok]
    e2e = sum((r.end_ns - (r.intended_ns or 0)) / 1e6 for r in ok)
    share = sum(waits) / e2e if ok and e2e > 0 else None
    loop = result.loop
    lag = None if loop is None else {"p50": loop.p(0.5), "p99": loop.p(0.99), "max": loop.max_lag_ms,
                                     "late_share": loop.late / loop.wakeups if loop.wakeups else None}
    verdict = None
    slow = offered is not None and achieved is not None and achieved < CLIENT_RATE_RATIO * offered
    if rs and (slow or (share is not None and share >= CLIENT_QUEUE_SHARE)):
        said = (f"sent {achieved:.2f} requests/s of the {offered:.2f} offered; " if offered and achieved else "")
        said += f"requests waited {_pct(share or 0)} of e2e in the client"
        # the wait splits in two: the loop getting round to a request late, then waiting for a slot
        late = sum((r.dispatched_ns or r.start_ns) - (r.intended_ns or 0) for r in rs)
        slot = sum(r.start_ns - (r.dispatched_ns or r.start_ns) for r in rs)
        if late > slot and result.cpu_share is not None and result.cpu_share >= CPU_BOUND:
            limit = f"CPU (the probe process used {result.cpu_share:.2f} cores)"
        elif late > slot:
            said_lag = (f"; {_pct(lag['late_share'])} of its wake-ups late by over {LAG_LIMIT_MS:g} ms"
                        if lag is not None and lag["late_share"] is not None else "")
            limit = f"the probe's event loop (it sent requests late{said_lag})"
        else:
            limit = (f"the concurrency cap ({result.config.concurrency} in flight): raise --concurrency to move "
                     "the wait into the server's queue")
        verdict = f"{said}; limit: {limit}"
    return {"offered_rps": offered, "achieved_rps": achieved, "client_queue_ms": stats(waits),
            "client_queue_share": share, "loop_lag_ms": lag, "cpu_share": result.cpu_share,
            "client_bound": verdict}


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
