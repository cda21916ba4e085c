"""What the figures draw, read from an :class:`analyzers.Analysis`: its tables and views, never a
second computation of a number the analysis reports.

The numbers printed on the page come from the analysis' JSON document (``analyze --json``).
What this module reads is the per-request and per-token material behind them, reduced to
what a figure can draw: the requests of the waterfalls and their spans and tokens, a quantile
grid of each latency distribution (the percentiles the analysis marks lie on it), a uniform
sample of the decode tokens (the fit line is the analysis', over every token), the engine's
timeline. Each reduction says what it kept (``note``), and the page prints it.

Per-token views are ordered windows: everything that needs one is taken in a single pass
over ``tokens_gaps`` (:func:`token_material`), so a 10M-token trace is sorted once more, not
once per figure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: Requests in each group of waterfalls: the slowest, then a spread of the rest.
SLOWEST = 8
TYPICAL = 8
#: Token ticks drawn per request at most (every k-th token past that; the page says so).
TICKS = 240
#: Points of a distribution's curve at most: past that, its quantiles on an even grid.
CDF_POINTS = 400
#: Decode points drawn at most (a uniform sample past that; the page says so).
DECODE_POINTS = 3000
#: Engine scrapes drawn at most per series (every k-th past that).
ENGINE_POINTS = 2000
#: Request arrivals drawn at most beside the engine (a uniform sample past that).
ARRIVALS = 3000
#: Tokens past which the per-token figures read a uniform sample of whole requests.
SAMPLE_TOKENS = 300_000
#: Quantile grid of a distribution with more values than CDF_POINTS.
ITL_GRID = [round(i / CDF_POINTS, 6) for i in range(1, CDF_POINTS)]


# -- waterfalls -------------------------------------------------------------------------------

@dataclass
class Lane:
    """One request on its own timeline, ms from its start: the client's view (``outline``:
    client.queue, client.request, server.request), each phase span (``phases``: component,
    start, end), and its tokens (``ticks``)."""

    trace: str
    request_id: str
    group: str  # "slowest" or "typical"
    e2e_ms: float
    outline: list[tuple[str, float, float]] = field(default_factory=list)
    phases: list[tuple[str, float, float]] = field(default_factory=list)
    ticks: list[float] = field(default_factory=list)
    tokens: int = 0


#: Span name -> the component it is drawn as (the attribution rule's names, docs/trace-format.md).
PHASE_COMPONENT = {"client.queue": "client_queue", "queue": "queue", "tokenize": "tokenize",
                   "preprocess": "preprocess", "prefill": "prefill", "decode": "decode",
                   "detokenize": "detokenize", "postprocess": "postprocess"}
OUTLINE = ("client.queue", "client.request", "server.request")


def pick_requests(req: pa.Table) -> list[tuple[str, str, str, float]]:
    """(trace, request_id, group, e2e) of the slowest successful requests and an even spread of
    the others over their e2e ranks (deterministic: ties broken by trace and id)."""
    ok = req.filter(pc.and_(pc.equal(req["ok"], True), pc.is_valid(req["e2e_ms"])))
    rows = sorted(zip(ok["trace"].to_pylist(), ok["request_id"].to_pylist(), ok["e2e_ms"].to_pylist(),
                      strict=True), key=lambda r: (-r[2], r[0], r[1]))
    slow = [(t, r, "slowest", e) for t, r, e in rows[:SLOWEST]]
    rest = rows[SLOWEST:][::-1]  # ascending e2e
    k = min(TYPICAL, len(rest))
    picks = sorted({int((i + 0.5) * len(rest) / k) for i in range(k)}) if k else []
    typical = [(rest[i][0], rest[i][1], "typical", rest[i][2]) for i in picks]
    return slow + typical


def lanes(a: Any) -> list[Lane]:
    """The waterfalls' requests with their spans and tokens, each on its own timeline."""
    picked = pick_requests(a.table("attribution_requests"))
    if not picked:
        return []
    values = ", ".join("(?, ?)" for _ in picked)
    params = [x for t, r, _, _ in picked for x in (t, r)]
    spans = a.query(f"SELECT s.trace, s.request_id, s.name, s.start_ns, s.end_ns, s.clock FROM spans AS s "
                    f"JOIN (VALUES {values}) AS v(trace, request_id) USING (trace, request_id)", params).to_pylist()
    toks = a.query(f"SELECT t.trace, t.request_id, t.index, t.emit_ns, t.client_recv_ns FROM tokens AS t "
                   f"JOIN (VALUES {values}) AS v(trace, request_id) USING (trace, request_id) "
                   "ORDER BY t.trace, t.request_id, t.index", params).to_pylist()
    by_req: dict[tuple[str, str], tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {
        (t, r): ([], []) for t, r, _, _ in picked}
    for s in spans:
        by_req[(s["trace"], s["request_id"])][0].append(s)
    for tk in toks:
        by_req[(tk["trace"], tk["request_id"])][1].append(tk)
    return [_lane(t, r, g, e, *by_req[(t, r)]) for t, r, g, e in picked]


def _lane(trace: str, rid: str, group: str, e2e: float, spans: list[dict[str, Any]],
          toks: list[dict[str, Any]]) -> Lane:
    lane = Lane(trace=trace, request_id=rid, group=group, e2e_ms=e2e, tokens=len(toks))
    client = [s for s in spans if s["clock"] == "client"]
    server = [s for s in spans if s["clock"] == "server"]
    creq = next((s for s in client if s["name"] == "client.request"), None)
    sreq = next((s for s in server if s["name"] == "server.request"), None)
    # Client spans on the client clock from the request's start (its intended send time when it
    # waited in the client); server spans placed inside client.request by the symmetric-delay
    # assumption (as merge's clock offsets and the TUI do): drawing only, no number comes from it.
    cq = [s for s in client if s["name"] == "client.queue"]
    origin_c = min([s["start_ns"] for s in cq] + ([creq["start_ns"]] if creq else [])) if (cq or creq) else None
    server_origin = (sreq["start_ns"] if sreq else min((s["start_ns"] for s in server), default=None))
    if server_origin is None and toks:
        server_origin = min(t["emit_ns"] for t in toks if t["emit_ns"] is not None)
    if origin_c is not None and creq is not None and sreq is not None:
        s_at = ((creq["start_ns"] - origin_c)
                + ((creq["end_ns"] - creq["start_ns"]) - (sreq["end_ns"] - sreq["start_ns"])) / 2)
    elif origin_c is not None and creq is not None:
        s_at = creq["start_ns"] - origin_c  # no server span to place: its phases start with the request
    else:
        s_at = 0.0

    def on_server(ns: int) -> float:
        return (s_at + ns - (server_origin or 0)) / 1e6

    for s in client:
        if s["name"] in OUTLINE and origin_c is not None:
            lane.outline.append((s["name"], (s["start_ns"] - origin_c) / 1e6, (s["end_ns"] - origin_c) / 1e6))
    for s in server:
        if s["name"] == "server.request":
            lane.outline.append((s["name"], on_server(s["start_ns"]), on_server(s["end_ns"])))
        elif s["name"] in PHASE_COMPONENT:
            lane.phases.append((PHASE_COMPONENT[s["name"]], on_server(s["start_ns"]), on_server(s["end_ns"])))
    for s in cq:
        if origin_c is not None:
            lane.phases.append(("client_queue", (s["start_ns"] - origin_c) / 1e6, (s["end_ns"] - origin_c) / 1e6))
    step = max(1, math.ceil(len(toks) / TICKS))
    for tk in toks[::step]:
        if tk["client_recv_ns"] is not None and origin_c is not None:
            lane.ticks.append((tk["client_recv_ns"] - origin_c) / 1e6)
        elif tk["emit_ns"] is not None and server_origin is not None:
            lane.ticks.append(on_server(tk["emit_ns"]))
    lane.outline.sort(key=lambda o: OUTLINE.index(o[0]))
    lane.phases.sort(key=lambda p: p[1])
    return lane


# -- distributions and decode: one pass over the per-token view --------------------------------

@dataclass
class Curve:
    """A distribution drawn as its cumulative curve: ``x`` values (ms) at cumulative share ``p``."""

    x: list[float]
    p: list[float]
    n: int
    exact: bool  # every value drawn (else its quantiles on an even grid)


@dataclass
class TokenMaterial:
    """From one pass over ``tokens_gaps``: the ITL curve and a sample of decode points."""

    itl: Curve | None = None
    points: list[tuple[float, float]] = field(default_factory=list)  # (kv_len, ms)
    points_total: int = 0  # decode tokens read (of the sampled requests)
    requests_sampled: int = 0  # requests read, when a sample of them (else 0: all)
    requests_total: int = 0


def curve(values: list[float | None]) -> Curve | None:
    """A per-request metric's curve: every value up to :data:`CDF_POINTS`, else quantiles."""
    v = np.sort(np.asarray([x for x in values if x is not None], dtype=np.float64))
    if v.size == 0:
        return None
    if v.size <= CDF_POINTS:
        return Curve(x=v.tolist(), p=((np.arange(v.size) + 1) / v.size).tolist(), n=int(v.size), exact=True)
    grid = np.asarray(ITL_GRID)
    return Curve(x=np.quantile(v, grid).tolist(), p=grid.tolist(), n=int(v.size), exact=False)


def token_material(a: Any, basis: str | None, tokens: int) -> TokenMaterial:
    """The ITL curve (per emission of successful requests, as the analysis' ITL percentiles) and
    a uniform sample of (kv_len, fitted time) of decode tokens, from one read of ``tokens_gaps``.

    Past :data:`SAMPLE_TOKENS` tokens the read covers a uniform sample of the successful requests
    (whole requests, as the report's bootstrap resamples them): the per-token view is an ordered
    window, and filtered on ``request_key`` it orders only those requests' tokens (a full pass over
    10M tokens costs as much as the whole analysis). ``basis`` is the decode fit's (``step``:
    forward-pass time, ``itl``: server-side gap); on ``batch-step`` the points come from the steps
    table instead (:func:`step_points`)."""
    out = TokenMaterial()
    if not tokens:
        return out
    where, params = "NOT failed", []
    if tokens > SAMPLE_TOKENS:
        n_req = a.query("SELECT count(*) FROM tokens_requests WHERE NOT failed").column(0)[0].as_py()
        take = max(1, math.ceil(n_req * SAMPLE_TOKENS / tokens))
        keys = a.query("SELECT request_key FROM tokens_requests WHERE NOT failed "
                       "ORDER BY hash(request_key), request_key LIMIT ?",
                       [take]).column(0).to_pylist()
        where += f" AND request_key IN ({', '.join('?' * len(keys))})"
        params = keys
        out.requests_sampled, out.requests_total = len(keys), int(n_req)
    y = "step_ms" if basis == "step" else "server_itl_ms"
    t = a.query(f"SELECT itl_ms, emission, kv_len::DOUBLE AS kv, {y} AS y FROM tokens_gaps WHERE {where}", params)
    em = t.filter(pc.and_(pc.equal(t["emission"], True), pc.is_valid(t["itl_ms"])))
    out.itl = curve(em["itl_ms"].to_pylist())
    if basis in ("step", "itl"):
        pts = em.filter(pc.and_(pc.is_valid(em["kv"]), pc.is_valid(em["y"])))
        kv, ys = pts["kv"].to_numpy(), pts["y"].to_numpy()
        out.points_total = len(kv)
        order = np.lexsort((ys, kv))  # rows come in DuckDB's parallel order: sort, then take evenly
        kv, ys = kv[order], ys[order]
        if len(kv) > DECODE_POINTS:
            idx = np.linspace(0, len(kv) - 1, DECODE_POINTS).astype(np.int64)
            kv, ys = kv[idx], ys[idx]
        out.points = sorted(zip(kv.tolist(), ys.tolist(), strict=True))
    return out


def step_points(a: Any) -> tuple[list[tuple[float, float, int]], int]:
    """Decode-only iterations (no prefill) of a batched trace: (summed KV tokens, step ms, batch
    size), a hash-spread sample past :data:`DECODE_POINTS`; and how many there are."""
    n = a.query("SELECT count(*) FROM steps WHERE prefill_tokens = 0 AND decode_tokens > 0 "
                "AND kv_tokens IS NOT NULL").column(0)[0].as_py()
    if not n:
        return [], 0
    every = max(1, math.ceil(n / DECODE_POINTS))
    rows = a.query("SELECT kv_tokens::DOUBLE AS kv, (end_ns - start_ns) / 1e6 AS ms, batch_size AS b FROM steps "
                   "WHERE prefill_tokens = 0 AND decode_tokens > 0 AND kv_tokens IS NOT NULL "
                   f"AND hash(trace, step_id, start_ns) % {every} = 0 ORDER BY 1, 2").to_pylist()
    return [(float(r["kv"]), float(r["ms"]), int(r["b"] or 0)) for r in rows], int(n)


# -- the engine ---------------------------------------------------------------------------------

@dataclass
class EngineSeries:
    """The engine's state over the measured window (seconds from its start), and the requests
    that arrived in it with their TTFT."""

    window_s: float
    clock: str
    t: list[float] = field(default_factory=list)
    waiting: list[float | None] = field(default_factory=list)
    running: list[float | None] = field(default_factory=list)
    kv: list[float | None] = field(default_factory=list)
    preempted: list[float | None] = field(default_factory=list)  # since the window's start
    arrivals: list[float] = field(default_factory=list)
    ttft: list[tuple[float, float]] = field(default_factory=list)  # (arrival s, TTFT ms)
    arrivals_total: int = 0
    scrapes: int = 0


def engine_series(a: Any, trace: str | None) -> EngineSeries | None:
    """``engine_timeline`` and the request spans on the metrics' clock, over ``engine_window``."""
    where, params = ("WHERE trace = ?", [trace]) if trace is not None else ("", [])
    w = a.query(f"SELECT trace, clock, start_ns, end_ns FROM engine_window {where} ORDER BY trace LIMIT 1",
                params).to_pylist()
    if not w:
        return None
    tr, clock, lo, hi = w[0]["trace"], w[0]["clock"], int(w[0]["start_ns"]), int(w[0]["end_ns"])
    out = EngineSeries(window_s=(hi - lo) / 1e9, clock=str(clock))
    tl = a.query("SELECT ts_ns, requests_waiting, requests_running, kv_cache_usage, preemptions "
                 "FROM engine_timeline WHERE trace = ? AND ts_ns BETWEEN ? AND ? ORDER BY ts_ns",
                 [tr, lo, hi]).to_pylist()
    before = a.query("SELECT arg_max(preemptions, ts_ns) AS p FROM engine_timeline "
                     "WHERE trace = ? AND ts_ns <= ? AND preemptions IS NOT NULL", [tr, lo]).to_pylist()
    base = before[0]["p"] if before and before[0]["p"] is not None else None
    out.scrapes = len(tl)
    step = max(1, math.ceil(len(tl) / ENGINE_POINTS))
    for r in tl[::step]:
        out.t.append((int(r["ts_ns"]) - lo) / 1e9)
        out.waiting.append(r["requests_waiting"])
        out.running.append(r["requests_running"])
        out.kv.append(None if r["kv_cache_usage"] is None else r["kv_cache_usage"] * 100)
        p = r["preemptions"]
        if p is not None and base is None:
            base = p
        out.preempted.append(None if p is None or base is None else max(0.0, p - base))
    name = "client.request" if clock == "client" else "server.request"
    n = a.query("SELECT count(*) FROM spans WHERE trace = ? AND name = ? AND clock = ? AND start_ns BETWEEN ? AND ?",
                [tr, name, clock, lo, hi]).column(0)[0].as_py()
    every = max(1, math.ceil(n / ARRIVALS))
    arr = a.query("SELECT s.start_ns, r.ttft_ms FROM spans AS s LEFT JOIN attribution_requests AS r "
                  "USING (trace, request_id) WHERE s.trace = ? AND s.name = ? AND s.clock = ? "
                  f"AND s.start_ns BETWEEN ? AND ? AND hash(s.request_id) % {every} = 0 ORDER BY s.start_ns",
                  [tr, name, clock, lo, hi]).to_pylist()
    out.arrivals_total = int(n)
    for r in arr:
        t = (int(r["start_ns"]) - lo) / 1e9
        out.arrivals.append(t)
        if r["ttft_ms"] is not None:
            out.ttft.append((t, float(r["ttft_ms"])))
    return out


__all__ = ["CDF_POINTS", "DECODE_POINTS", "SLOWEST", "TICKS", "TYPICAL", "Curve", "EngineSeries", "Lane",
           "TokenMaterial", "curve", "engine_series", "lanes", "pick_requests", "step_points", "token_material"]
