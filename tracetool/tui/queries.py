"""The SQL behind the screens that need more than the analysis's summary tables.

Every function here runs in a worker thread, takes a :class:`View`, holds its
lock while it uses the DuckDB connection, and returns plain data (lists,
dataclasses) for a widget to draw. The figures are the analyzers' views
(``tokens_gaps``, ``gpu_windows``, ...); what is computed here is only binning
for the screen: a million tokens become a few hundred points.

The SQL console (:func:`run_console`) runs only reading statements; external
access was switched off when the analyzers built the connection.

No textual here (tested headless).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from tracetool.tui.model import View
from tracetool.untrusted import clip

#: Bins of the ITL-over-index line and the kv_len axis of the density plot.
INDEX_BINS = 240
KV_BINS = 320
Y_BINS = 96
#: Time buckets of GPU and CPU series.
TIME_BUCKETS = 240


#: DuckDB threads of a screen's queries: all cores but one, which stays with drawing and keys. A screen's
#: query runs while the user moves on (the Decode screen bins every token again: seconds at 10M tokens),
#: and on two cores a query on both starved the app's thread: a view switch took 190-310 ms.
SCREEN_THREADS = max(1, (os.cpu_count() or 1) - 1)


@contextmanager
def _connection(view: View) -> Iterator[duckdb.DuckDBPyConnection]:
    """The view's connection, its lock held, with at most :data:`SCREEN_THREADS` threads (the
    analysis's own setting is put back: a live view analyses the next snapshot on it)."""
    with view.lock:
        con = view.analysis.con
        threads = con.execute("SELECT current_setting('threads')").fetchall()[0][0]
        con.execute(f"SET threads = {min(int(threads), SCREEN_THREADS)}")
        try:
            yield con
        finally:
            con.execute(f"SET threads = {int(threads)}")


def _sql(view: View, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    with _connection(view) as con:
        return con.execute(sql, params or []).fetchall()


def _arrow(view: View, sql: str, params: list[Any] | None = None) -> pa.Table:
    with _connection(view) as con:
        return con.sql(sql, params=params or None).to_arrow_table()


# -- decode ---------------------------------------------------------------------------------

@dataclass
class DecodeData:
    """ITL over token index, and the fitted quantity against kv_len, binned for plotting.

    Attributes:
        basis: what ``density`` plots: ``step`` (forward-pass time) or ``itl``
            (server-side gap) — the decode fit's basis, so the fitted line fits the points.
        by_index: (token index, ITL p50 ms, ITL p90 ms) per index bin.
        density: (kv_len, ms, tokens) at the centre of every non-empty cell of a
            kv_len x time grid; tokens above the grid (past 1.5 x the 95th percentile,
            e.g. steps stretched by a prefill) are counted in its top row.
        kv_range, y_max: the grid's extent.
        tokens: decode tokens plotted.
    """

    basis: str
    by_index: list[tuple[float, float, float]] = field(default_factory=list)
    density: list[tuple[float, float, int]] = field(default_factory=list)
    kv_range: tuple[float, float] | None = None
    y_max: float = 0.0
    tokens: int = 0


def decode_data(view: View) -> DecodeData:
    """Bin the decode tokens of successful requests (one pass over ``tokens_gaps``)."""
    fit = (view.doc.get("decode") or {}).get("fit") or {}
    basis = fit.get("basis") or "itl"
    y = "step_ms" if basis == "step" else "server_itl_ms"
    rows = _sql(view, f"""
        WITH g AS MATERIALIZED (
            SELECT index, kv_len, itl_ms, {y} AS y FROM tokens_gaps WHERE NOT failed AND itl_ms IS NOT NULL
        ),
        s AS (
            SELECT count(*) AS n, max(index) AS imax, min(kv_len) AS lo, max(kv_len) AS hi,
                   quantile_cont(y, 0.95) AS yq, max(y) AS ymax FROM g
        ),
        lim AS (SELECT *, greatest(coalesce(least(yq * 1.5, ymax), 0), 1e-6) AS ytop FROM s)
        SELECT 'stats' AS kind, n::DOUBLE, lo::DOUBLE, hi::DOUBLE, ytop, imax::DOUBLE FROM lim
        UNION ALL
        SELECT 'index', b::DOUBLE, avg(index), quantile_cont(itl_ms, 0.5), quantile_cont(itl_ms, 0.9), NULL
        FROM (SELECT g.index, g.itl_ms, (g.index * {INDEX_BINS}) // (lim.imax + 1) AS b FROM g, lim)
        GROUP BY b
        UNION ALL
        SELECT 'kv', xb::DOUBLE, yb::DOUBLE, count(*)::DOUBLE, NULL, NULL
        FROM (SELECT least(((g.kv_len - lim.lo) * {KV_BINS}) // (lim.hi - lim.lo + 1), {KV_BINS - 1}) AS xb,
                     least(floor(g.y / lim.ytop * {Y_BINS}), {Y_BINS - 1})::BIGINT AS yb
              FROM g, lim WHERE g.kv_len IS NOT NULL AND g.y IS NOT NULL AND g.y >= 0)
        GROUP BY xb, yb
    """)
    out = DecodeData(basis=basis)
    stats = next((r for r in rows if r[0] == "stats"), None)
    if stats is None or not stats[1]:
        return out
    _, n, lo, hi, ytop, _imax = stats
    out.tokens = int(n)
    out.y_max = float(ytop)
    out.by_index = sorted((float(r[2]), float(r[3]), float(r[4])) for r in rows if r[0] == "index")
    if lo is not None and hi is not None:
        width = (hi - lo + 1) / KV_BINS
        out.kv_range = (float(lo), float(hi))
        out.density = sorted((lo + (r[1] + 0.5) * width, (r[2] + 0.5) * ytop / Y_BINS, int(r[3]))
                             for r in rows if r[0] == "kv")
    return out


# -- GPU and CPU ----------------------------------------------------------------------------

@dataclass
class SystemData:
    """GPU metrics and CPU sample categories over the trace's time, in equal buckets.

    Attributes:
        t0_ns, bucket_ns: the buckets' origin and width (server clock).
        gpu: metric -> GPU index -> one value per bucket (None where no sample).
        decode: per bucket, the share of it inside a decode window (0..1).
        cpu: category -> per bucket, its share of the bucket's samples (0..1).
        cpu_samples: samples per bucket.
    """

    t0_ns: int = 0
    bucket_ns: int = 1
    buckets: int = 0
    gpu: dict[str, dict[int, list[float | None]]] = field(default_factory=dict)
    decode: list[float] = field(default_factory=list)
    cpu: dict[str, list[float]] = field(default_factory=dict)
    cpu_samples: list[int] = field(default_factory=list)

    @property
    def span_s(self) -> float:
        return self.buckets * self.bucket_ns / 1e9


GPU_METRICS = {
    "sm": "coalesce(sm_util_pct, gpu_util_pct)",
    "dram": "dram_bw_util_pct",
    "mem": "mem_util_pct",
    "power": "power_w",
}


def system_data(view: View, buckets: int = TIME_BUCKETS) -> SystemData:
    """Bucket the ``gpu`` and ``stacks`` tables and mark the decode windows (``gpu_windows``)."""
    has_gpu, has_stacks = view.doc.get("gpu") is not None, view.doc.get("cpu") is not None
    out = SystemData()
    if not has_gpu and not has_stacks:
        return out
    parts = []
    if has_gpu:
        parts.append("SELECT min(ts_ns) AS lo, max(ts_ns) AS hi FROM gpu")
        parts.append("SELECT min(start_ns), max(end_ns) FROM gpu_windows")
    if has_stacks:
        parts.append("SELECT min(ts_ns), max(ts_ns) FROM stacks")
    lo, hi = _sql(view, "SELECT min(lo), max(hi) FROM (" + " UNION ALL ".join(parts) + ")")[0]
    if lo is None:
        return out
    width = max(1, -(-(int(hi) - int(lo) + 1) // buckets))
    out.t0_ns, out.bucket_ns, out.buckets = int(lo), width, buckets
    if has_gpu:
        cols = ", ".join(f"avg({expr}) AS {name}" for name, expr in GPU_METRICS.items())
        rows = _sql(view, f"SELECT gpu, (ts_ns - ?) // ? AS b, {cols} FROM gpu GROUP BY ALL ORDER BY 1, 2",
                    [out.t0_ns, width])
        for name_i, name in enumerate(GPU_METRICS):
            series: dict[int, list[float | None]] = {}
            for r in rows:
                vals = series.setdefault(int(r[0]), [None] * buckets)
                b = min(int(r[1]), buckets - 1)
                v = r[2 + name_i]
                vals[b] = None if v is None else float(v)
            if any(v is not None for vals in series.values() for v in vals):
                out.gpu[name] = series
        out.decode = [0.0] * buckets
        for start, end in _sql(view, "SELECT start_ns, end_ns FROM gpu_windows ORDER BY start_ns"):
            _cover(out.decode, int(start) - out.t0_ns, int(end) - out.t0_ns, width)
    if has_stacks:
        rows = _sql(view, "SELECT (ts_ns - ?) // ? AS b, category, sum(weight) FROM stacks GROUP BY ALL",
                    [out.t0_ns, width])
        totals = [0] * buckets
        counts: dict[str, list[int]] = {}
        for b, cat, w in rows:
            b = min(int(b), buckets - 1)
            totals[b] += int(w)
            counts.setdefault(str(cat), [0] * buckets)[b] += int(w)
        order = [r["category"] for r in view.analysis.rows("stacks_categories")]
        for cat in [c for c in order if c in counts] + [c for c in counts if c not in order]:
            out.cpu[cat] = [c / t if t else 0.0 for c, t in zip(counts[cat], totals, strict=True)]
        out.cpu_samples = totals
    return out


def _cover(shares: list[float], start: int, end: int, width: int) -> None:
    """Add the part of [start, end) that falls in each bucket, as a share of the bucket."""
    if end <= start:
        return
    first, last = max(0, start // width), min(len(shares) - 1, (end - 1) // width)
    for b in range(first, last + 1):
        lo, hi = max(start, b * width), min(end, (b + 1) * width)
        if hi > lo:
            shares[b] = min(1.0, shares[b] + (hi - lo) / width)


# -- requests -------------------------------------------------------------------------------

#: Sort keys of the Requests table: key -> (column, descending first).
REQUEST_SORTS = {"e2e": ("e2e_ms", True), "ttft": ("ttft_ms", True), "itl": ("itl_p50_ms", True),
                 "tokens": ("output_tokens", True), "bottleneck": ("bottleneck", False)}
REQUEST_LIMIT = 1000


def request_table(view: View) -> pa.Table:
    """Every request with e2e, TTFT, ITL p50 (``tokens_request_itl``), tokens and bottleneck."""
    return _arrow(view, """
        SELECT a.trace, a.request_id, a.ok, a.e2e_ms, a.ttft_ms, i.itl_p50_ms, a.output_tokens, a.bottleneck
        FROM attribution_requests AS a LEFT JOIN tokens_request_itl AS i USING (trace, request_id)
    """)


def sort_requests(table: pa.Table, key: str, descending: bool | None = None,
                  limit: int = REQUEST_LIMIT) -> pa.Table:
    """The first ``limit`` rows in the order of ``key`` (nulls last, then by request id)."""
    column, desc = REQUEST_SORTS[key]
    if descending is not None:
        desc = descending
    order = [(column, "descending" if desc else "ascending", "at_end"), ("trace", "ascending", "at_end"),
             ("request_id", "ascending", "at_end")]
    return table.sort_by(order).slice(0, limit)


@dataclass
class RequestDetail:
    """One request: its attribution row, spans (ns from the server.request start) and tokens."""

    trace: str
    request_id: str
    row: dict[str, Any]
    spans: list[dict[str, Any]]
    tokens: list[dict[str, Any]]
    origin_ns: int | None


def request_detail(view: View, trace: str, request_id: str) -> RequestDetail:
    """Spans and tokens of one request; client spans are placed by the symmetric-delay assumption."""
    attr = view.analysis.table("attribution_requests")
    rows = attr.filter(pc.and_(pc.equal(attr["trace"], trace), pc.equal(attr["request_id"], request_id))).to_pylist()
    row = rows[0] if rows else {"trace": trace, "request_id": request_id}
    spans = [dict(zip(("name", "start_ns", "end_ns", "clock"), r, strict=True)) for r in _sql(view, """
        SELECT name, start_ns, end_ns, clock FROM spans WHERE trace = ? AND request_id = ?
        ORDER BY clock = 'server', start_ns, name""", [trace, request_id])]
    server = [s for s in spans if s["clock"] == "server"]
    server_req = next((s for s in server if s["name"] == "server.request"), None)
    origin = server_req["start_ns"] if server_req else (min(s["start_ns"] for s in server) if server else None)
    tokens = [dict(zip(("index", "emit_ns", "kv_len", "batch_size"), r, strict=True)) for r in _sql(view, """
        SELECT index, emit_ns, kv_len, batch_size FROM tokens WHERE trace = ? AND request_id = ? ORDER BY index""",
        [trace, request_id])]
    if origin is None and tokens:
        origin = min(t["emit_ns"] for t in tokens)
    # Filter the per-token view on request_key, its sort's partition: ~40x faster than on the id.
    key = row.get("request_key")
    where, params = ("request_key = ?", [key]) if key is not None else (
        "trace = ? AND request_id = ?", [trace, request_id])
    gaps = {r[0]: r[1:] for r in _sql(view, f"""
        SELECT index, itl_ms, itl_clock, step_ms, host_ms FROM tokens_gaps WHERE {where}""", params)}
    for t in tokens:
        itl, clock, step, host = gaps.get(t["index"], (None, None, None, None))
        t.update(itl_ms=itl, itl_clock=clock, step_ms=step, host_ms=host)
    return RequestDetail(trace, request_id, row, spans, tokens, origin)


# -- SQL console ----------------------------------------------------------------------------

class ConsoleRefused(Exception):
    """A statement the read-only console does not run; ``str(e)`` says why, in one line."""


@dataclass
class ConsoleResult:
    columns: list[str]
    rows: list[tuple[Any, ...]]
    truncated: bool
    elapsed_s: float


#: Statement types the console runs: reading only.
_READING = {"SELECT", "EXPLAIN"}


def check_readonly(con: duckdb.DuckDBPyConnection, sql: str) -> str:
    """The one reading statement in ``sql``; raises :class:`ConsoleRefused` otherwise."""
    if not sql.strip():
        raise ConsoleRefused("nothing to run")
    try:
        statements = con.extract_statements(sql)
    except duckdb.Error as e:
        raise ConsoleRefused(_one_line(e)) from e
    if len(statements) != 1:
        raise ConsoleRefused(f"one statement at a time ({len(statements)} given)")
    kind = str(statements[0].type).rsplit(".", 1)[-1]
    if kind not in _READING:
        word = {"LOAD": "INSTALL/LOAD"}.get(kind, kind)
        raise ConsoleRefused(f"read-only console: {word} statements are refused "
                             "(SELECT, FROM, WITH, DESCRIBE, SHOW, SUMMARIZE and EXPLAIN run here)")
    return str(statements[0].query)


def run_console(view: View, sql: str, max_rows: int = 500) -> ConsoleResult:
    """Run one reading statement; at most ``max_rows`` rows come back.

    Raises:
        ConsoleRefused: a writing statement, several statements, or a DuckDB error
            (a missing table, a file read refused by the disabled external access).
    """
    t0 = time.perf_counter()
    with _connection(view) as con:
        query = check_readonly(con, sql)
        try:
            cur = con.execute(query)
            columns = [d[0] for d in cur.description or []]
            rows = cur.fetchmany(max_rows + 1)
        except duckdb.Error as e:
            raise ConsoleRefused(_one_line(e)) from e
    return ConsoleResult(columns, [tuple(r) for r in rows[:max_rows]], len(rows) > max_rows,
                         time.perf_counter() - t0)


def interrupt(view: View) -> None:
    """Stop the query running on the view's connection (the console's Escape)."""
    view.analysis.con.interrupt()


def object_names(view: View) -> list[str]:
    """Names the console can query: the trace tables and every analyzer object."""
    from analyzers import documented_objects
    from tracetool.schema import TABLES

    return [*TABLES, *documented_objects()]


def _one_line(e: BaseException) -> str:
    """DuckDB's message without its ``LINE 1: ...`` excerpt, on one line."""
    text = " ".join(str(e).split())
    return clip(text.split(" LINE ", 1)[0], 400)


__all__ = ["GPU_METRICS", "REQUEST_LIMIT", "REQUEST_SORTS", "ConsoleRefused", "ConsoleResult", "DecodeData",
           "RequestDetail", "SystemData", "check_readonly", "decode_data", "interrupt", "object_names",
           "request_detail", "request_table", "run_console", "sort_requests", "system_data"]
