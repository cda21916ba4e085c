"""A trace as Chrome trace-event JSON (the ``traceEvents`` format) for ui.perfetto.dev.

Layout (docs/perfetto.md says what each track is):

* process 1 ``server``: one thread track per request holding its server-clock
  spans as ``B``/``E`` pairs and one ``i`` instant per token at ``emit_ns``;
* process 2 ``client``: one thread track per request with its client-clock
  spans (``client.request``) and, where recorded, one instant per token at
  ``client_recv_ns``. Client and server clocks are unrelated, so each
  process has its own zero: only durations compare across them;
* process 3 ``engine``: engine steps as ``B``/``E`` on one track and one
  counter track (``C``) per GPU column of the ``gpu`` table.

Why thread tracks rather than async (``b``/``e``) ones: Perfetto draws a
thread track per request with its spans nested and the token instants on the
same track, and names it from a ``thread_name`` metadata event; async tracks
would put ``i`` instants elsewhere. ``B``/``E`` must nest on a track, so
spans of one request that overlap without nesting go to an extra track
(``<request> (overlap 1)``) instead of being dropped or mis-nested.

Timestamps are microseconds since the first event of the same clock,
written with three decimals, so nanoseconds survive. ``displayTimeUnit`` is
left out on purpose: Perfetto reads ``"ns"`` there as the unit of ``ts``.
Events are written as they are made (one request at a time, tokens read in
record batches), so memory grows with the trace's Arrow tables, not with the
JSON.
"""

from __future__ import annotations

import heapq
import json
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any, TextIO

import pyarrow as pa
import pyarrow.compute as pc

from tracetool.reader import Trace
from tracetool.schema import CLIENT_REQUEST, SERVER_REQUEST

SERVER_PID, CLIENT_PID, ENGINE_PID = 1, 2, 3
#: Thread ids are unique across processes and never equal a pid: Perfetto keys
#: threads by tid first (as on Linux) and gives an event without tid the tid of its pid.
TID_BASE = 10
PROCESS_NAMES = {
    SERVER_PID: "server (server clock)",
    CLIENT_PID: "client (client clock, unrelated to the server clock)",
    ENGINE_PID: "engine steps and GPU (server clock)",
}
CLIENT_ARG = "client (unrelated to the server clock: compare durations only)"
_BATCH_ROWS = 65536
_TOKEN_COLS = ("request_id", "index", "emit_ns", "kv_len", "client_recv_ns", "batch_size", "step_id")


@dataclass
class ExportStats:
    """What an export wrote; returned to the CLI and its tests."""

    events: int = 0
    requests: int = 0
    spans: int = 0
    tokens: int = 0
    token_receipts: int = 0
    steps: int = 0
    counter_samples: int = 0
    overlap_tracks: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class _Sink:
    """Writes events one by one, commas in between, and counts them."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.n = 0
        self._buf: list[str] = []

    def put(self, event: str) -> None:
        self._buf.append(event)
        self.n += 1
        if len(self._buf) >= 4096:
            self.flush()

    def put_many(self, events: list[str]) -> None:
        self._buf.extend(events)
        self.n += len(events)
        if len(self._buf) >= 4096:
            self.flush()

    def flush(self) -> None:
        if self._buf:
            lead = ",\n" if self.n > len(self._buf) else "\n"
            self.out.write(lead + ",\n".join(self._buf))
            self._buf.clear()


def export_perfetto(trace: Trace, out: TextIO) -> ExportStats:
    """Write ``trace`` to ``out`` as one Chrome trace-event JSON document."""
    stats = ExportStats()
    emit_clock = "client" if (trace.meta.get("import") or {}).get("emit_ns_clock") == "client" else "server"
    spans = trace.table("spans")
    tokens = trace.table("tokens")
    base = {"server": _server_base(trace, emit_clock), "client": _client_base(trace, emit_clock)}
    order = _request_order(spans, tokens, emit_clock)
    facts = _request_facts(trace.table("requests"))
    by_request = _spans_by_request(spans)

    out.write('{"traceEvents":[')
    sink = _Sink(out)
    used = _used_processes(trace, spans, tokens, emit_clock)
    for pid in sorted(used):
        sink.put(_meta(pid, None, "process_name", PROCESS_NAMES[pid]))
    tids = _Tids(len(order))
    token_groups = _token_groups(tokens)
    pending = next(token_groups, None)
    for rid in sorted(order):
        toks: list[tuple[Any, ...]] = []
        if pending is not None and pending[0] == rid:  # both walk the ids in sorted order
            toks = pending[1]
            pending = next(token_groups, None)
        stats.requests += 1
        _request_events(sink, stats, rid, order[rid], by_request.get(rid, []), toks, facts.get(rid),
                         base, emit_clock, tids)
    engine_tid = tids.new()
    _steps(sink, stats, trace.table("steps"), base["server"], engine_tid, tids)
    _gpu_counters(sink, stats, trace.table("gpu"), base["server"], engine_tid)
    sink.flush()
    stats.events = sink.n
    other = {"producer": "tracetool export --perfetto", "trace": str(trace.path),
             "clocks": "server and client timestamps are microseconds since the first event of their "
                       "own clock; the two clocks are unrelated",
             "tokens_emit_clock": emit_clock, "notes": list(trace.meta.get("notes") or []),
             "stats": stats.as_dict()}
    out.write("\n],\n\"otherData\":" + json.dumps(other) + "}\n")
    return stats


# -- per request -----------------------------------------------------------------------

class _Tids:
    """Thread ids: request ``n`` (1-based, in start order) gets ``TID_BASE + n`` on the server
    and ``TID_BASE + count + n`` on the client; extra tracks take the ids after those."""

    def __init__(self, requests: int) -> None:
        self.requests = requests
        self.next = TID_BASE + 2 * requests + 1

    def of(self, pid: int, order: int) -> int:
        return TID_BASE + order + (self.requests if pid == CLIENT_PID else 0)

    def new(self) -> int:
        self.next += 1
        return self.next - 1


def _request_events(sink: _Sink, stats: ExportStats, rid: str, order: int,
                    spans: list[tuple[str, int, int, str]], toks: list[tuple[Any, ...]],
                    facts: dict[str, Any] | None, base: dict[str, int | None], emit_clock: str,
                    tids: _Tids) -> None:
    rid_json = json.dumps(rid)
    for clock, pid in (("server", SERVER_PID), ("client", CLIENT_PID)):
        tid = tids.of(pid, order)
        mine = [(name, start, end, _span_args(rid_json, name, clock, facts))
                for name, start, end, c in spans if c == clock]
        instants = _token_instants(pid, tid, rid_json, toks, clock, emit_clock, base[clock], stats)
        if not mine and not instants:
            continue
        b = base[clock] or 0
        sink.put(_meta(pid, tid, "thread_name", rid))
        for k, lane in enumerate(_lanes(mine) or [[]]):
            lane_tid = tid
            if k:
                lane_tid = tids.new()
                stats.overlap_tracks += 1
                sink.put(_meta(pid, lane_tid, "thread_name", f"{rid} (overlap {k})"))
            stats.spans += len(lane)
            events = _nested_events(pid, lane_tid, lane, b)
            if k == 0 and instants:
                events = list(heapq.merge(events, instants, key=lambda e: e[0])) if events else instants
            sink.put_many([ev for _, ev in events])


def _span_args(rid_json: str, name: str, clock: str, facts: dict[str, Any] | None) -> str:
    args = f'"request_id":{rid_json}'
    if clock == "client":
        args += f',"clock":"{CLIENT_ARG}"'
    if facts and name in (CLIENT_REQUEST, SERVER_REQUEST):
        args += "," + json.dumps(facts)[1:-1]
    return "{" + args + "}"


def _token_instants(pid: int, tid: int, rid_json: str, toks: list[tuple[Any, ...]], clock: str,
                    emit_clock: str, base: int | None, stats: ExportStats) -> list[tuple[int, str]]:
    """Token instants of one request on one clock's track, ordered by time.

    The hot loop of a large export: one formatted string per token, no helper calls.
    """
    if not toks or base is None:
        return []
    out: list[tuple[int, str]] = []
    head = f'{{"ph":"i","s":"t","pid":{pid},"tid":{tid},"ts":'
    if clock == emit_clock:  # tokens at emit_ns (rows come sorted by emit_ns)
        mid = f',"name":"token","cat":"token","args":{{"request_id":{rid_json},"index":'
        for _, index, emit, kv, _recv, batch, step in toks:
            d = emit - base
            extra = ((f',"kv_len":{kv}' if kv is not None else "")
                     + (f',"batch_size":{batch}' if batch is not None else "")
                     + (f',"step_id":{step}' if step is not None else ""))
            out.append((emit, f"{head}{d // 1000}.{d % 1000:03d}{mid}{index}{extra}}}}}"))
        stats.tokens += len(out)
    elif clock == "client":  # server-clock tokens as the client received them
        mid = f',"name":"token recv","cat":"token","args":{{"request_id":{rid_json},"index":'
        tail = f',"clock":"{CLIENT_ARG}"}}}}'
        for _, index, _emit, _kv, recv, _batch, _step in toks:
            if recv is not None:
                d = recv - base
                out.append((recv, f"{head}{d // 1000}.{d % 1000:03d}{mid}{index}{tail}"))
        out.sort(key=lambda e: e[0])
        stats.token_receipts += len(out)
    return out


def _lanes(spans: list[tuple[str, int, int, str]]) -> list[list[tuple[str, int, int, str]]]:
    """Split spans into lanes where every pair of spans nests or is disjoint (B/E need that)."""
    lanes: list[list[tuple[str, int, int, str]]] = []
    stacks: list[list[int]] = []  # open end times per lane
    for s in sorted(spans, key=lambda s: (s[1], -s[2], s[0])):
        for lane, stack in zip(lanes, stacks, strict=True):
            while stack and stack[-1] <= s[1]:
                stack.pop()
            if not stack or s[2] <= stack[-1]:
                lane.append(s)
                stack.append(s[2])
                break
        else:
            lanes.append([s])
            stacks.append([s[2]])
    return lanes


def _nested_events(pid: int, tid: int, lane: list[tuple[str, int, int, str]],
                   base: int) -> list[tuple[int, str]]:
    """B/E events of one lane in file order: parents open first, children close first.

    A lane holds ``(name, start_ns, end_ns, args JSON)`` tuples that nest or are disjoint.
    """
    out: list[tuple[int, str]] = []
    open_: list[tuple[str, int]] = []
    for name, start, end, args in lane:
        while open_ and open_[-1][1] <= start:
            n, e = open_.pop()
            out.append((e, _end(pid, tid, e - base, n)))
        out.append((start, _begin(pid, tid, start - base, name, args)))
        open_.append((name, end))
    while open_:
        n, e = open_.pop()
        out.append((e, _end(pid, tid, e - base, n)))
    return out


# -- engine steps and GPU counters -------------------------------------------------------

def _steps(sink: _Sink, stats: ExportStats, steps: pa.Table, base: int | None, first_tid: int,
           tids: _Tids) -> None:
    if not steps.num_rows or base is None:
        return
    cols = ("step_id", "start_ns", "end_ns", "batch_size", "prefill_tokens", "decode_tokens", "kv_tokens")
    rows: list[tuple[str, int, int, str]] = []
    for batch in steps.select(list(cols)).to_batches(_BATCH_ROWS):
        for sid, s, e, bs, pf, dc, kv in zip(*(batch.column(c).to_pylist() for c in cols), strict=True):
            rows.append(("step", s, e, f'{{"step_id":{sid},"batch_size":{bs},"prefill_tokens":{pf},'
                                       f'"decode_tokens":{dc},"kv_tokens":{kv}}}'))
    sink.put(_meta(ENGINE_PID, first_tid, "thread_name", "engine steps"))
    for k, lane in enumerate(_lanes(rows)):
        tid = tids.new() if k else first_tid
        if k:
            sink.put(_meta(ENGINE_PID, tid, "thread_name", f"engine steps (overlap {k})"))
        for _, ev in _nested_events(ENGINE_PID, tid, lane, base):
            sink.put(ev)
        stats.steps += len(lane)


def _gpu_counters(sink: _Sink, stats: ExportStats, gpu: pa.Table, base: int | None, tid: int) -> None:
    if not gpu.num_rows or base is None:
        return
    names = [c for c in gpu.schema.names if c not in ("ts_ns", "gpu")
             and (pa.types.is_integer(gpu.schema.field(c).type) or pa.types.is_floating(gpu.schema.field(c).type))]
    ordered = gpu.sort_by([("gpu", "ascending"), ("ts_ns", "ascending")])
    for batch in ordered.to_batches(_BATCH_ROWS):
        ts_col = batch.column("ts_ns").to_pylist()
        gpu_col = batch.column("gpu").to_pylist()
        values = [batch.column(c).to_pylist() for c in names]
        for i, ts in enumerate(ts_col):
            parts = []
            for name, col in zip(names, values, strict=True):
                v = col[i]
                if v is None or (isinstance(v, float) and not math.isfinite(v)):
                    continue
                parts.append(f'"{name}":{v!r}')
            if not parts:
                continue
            sink.put(f'{{"ph":"C","pid":{ENGINE_PID},"tid":{tid},"ts":{_us(ts - base)},"name":"GPU {gpu_col[i]}",'
                     f'"args":{{{",".join(parts)}}}}}')
            stats.counter_samples += 1


# -- reading the trace ---------------------------------------------------------------------

def _min(col: pa.ChunkedArray | pa.Array) -> int | None:
    if len(col) == 0:
        return None
    v = pc.min(col).as_py()
    return None if v is None else int(v)


def _lowest(*values: int | None) -> int | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def _server_base(trace: Trace, emit_clock: str) -> int | None:
    spans = trace.table("spans")
    server = spans.filter(pc.equal(spans.column("clock"), "server")) if spans.num_rows else spans
    tokens = trace.table("tokens")
    return _lowest(_min(server.column("start_ns")),
                   _min(tokens.column("emit_ns")) if emit_clock == "server" else None,
                   _min(trace.table("gpu").column("ts_ns")), _min(trace.table("steps").column("start_ns")))


def _client_base(trace: Trace, emit_clock: str) -> int | None:
    spans = trace.table("spans")
    client = spans.filter(pc.equal(spans.column("clock"), "client")) if spans.num_rows else spans
    tokens = trace.table("tokens")
    return _lowest(_min(client.column("start_ns")), _min(tokens.column("client_recv_ns")),
                   _min(tokens.column("emit_ns")) if emit_clock == "client" else None)


def _request_order(spans: pa.Table, tokens: pa.Table, emit_clock: str) -> dict[str, int]:
    """Request id -> track id (1, 2, ...) in the order the requests started."""
    first: dict[str, tuple[int, int]] = {}
    rank = {"server": 0, "client": 1}
    if spans.num_rows:
        g = spans.group_by(["request_id", "clock"]).aggregate([("start_ns", "min")])
        for rid, clock, t in zip(*(g.column(c).to_pylist() for c in ("request_id", "clock", "start_ns_min")),
                                 strict=True):
            key = (rank.get(clock, 2), t)
            if rid not in first or key < first[rid]:
                first[rid] = key
    if tokens.num_rows:
        g = tokens.group_by("request_id").aggregate([("emit_ns", "min")])
        for rid, t in zip(g.column("request_id").to_pylist(), g.column("emit_ns_min").to_pylist(), strict=True):
            key = (rank[emit_clock], t)
            if rid not in first or key < first[rid]:
                first[rid] = key
    ids = sorted(first, key=lambda r: (first[r], r))
    return {rid: i + 1 for i, rid in enumerate(ids)}


def _spans_by_request(spans: pa.Table) -> dict[str, list[tuple[str, int, int, str]]]:
    out: dict[str, list[tuple[str, int, int, str]]] = {}
    cols = ("request_id", "name", "start_ns", "end_ns", "clock")
    for batch in spans.select(list(cols)).to_batches(_BATCH_ROWS):
        for rid, name, s, e, clock in zip(*(batch.column(c).to_pylist() for c in cols), strict=True):
            out.setdefault(rid, []).append((name, s, e, clock))
    return out


def _request_facts(requests: pa.Table) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    cols = [c for c in ("prompt_tokens", "output_tokens", "status", "error") if c in requests.schema.names]
    for row in requests.select(["request_id", *cols]).to_pylist():
        rid = row.pop("request_id")
        out[rid] = {k: v for k, v in row.items() if v is not None}
    return out


def _token_groups(tokens: pa.Table) -> Iterator[tuple[str, list[tuple[Any, ...]]]]:
    """(request id, its token rows ordered by emit time) in request-id order, read in batches."""
    if not tokens.num_rows:
        return
    ordered = tokens.select(list(_TOKEN_COLS)).sort_by(
        [("request_id", "ascending"), ("emit_ns", "ascending"), ("index", "ascending")])
    rid: str | None = None
    rows: list[tuple[Any, ...]] = []
    for batch in ordered.to_batches(_BATCH_ROWS):
        for row in zip(*(batch.column(c).to_pylist() for c in _TOKEN_COLS), strict=True):
            if row[0] != rid:
                if rid is not None:
                    yield rid, rows
                rid, rows = row[0], []
            rows.append(row)
    if rid is not None:
        yield rid, rows


def _used_processes(trace: Trace, spans: pa.Table, tokens: pa.Table, emit_clock: str) -> set[int]:
    clocks = set(pc.unique(spans.column("clock")).to_pylist()) if spans.num_rows else set()
    used = set()
    if "server" in clocks or (tokens.num_rows and emit_clock == "server"):
        used.add(SERVER_PID)
    if "client" in clocks or (tokens.num_rows and emit_clock == "client") or (
            tokens.num_rows and tokens.column("client_recv_ns").null_count < tokens.num_rows):
        used.add(CLIENT_PID)
    if trace.rows("gpu") or trace.rows("steps"):
        used.add(ENGINE_PID)
    return used


# -- event text ------------------------------------------------------------------------------

def _us(ns: int) -> str:
    """Nanoseconds as microseconds with three decimals, exactly (no float rounding)."""
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    return f"{sign}{ns // 1000}.{ns % 1000:03d}"


def _meta(pid: int, tid: int | None, what: str, name: str) -> str:
    t = "" if tid is None else f',"tid":{tid}'
    return f'{{"ph":"M","pid":{pid}{t},"name":"{what}","args":{{"name":{json.dumps(name)}}}}}'


def _begin(pid: int, tid: int, ts: int, name: str, args: str) -> str:
    return f'{{"ph":"B","pid":{pid},"tid":{tid},"ts":{_us(ts)},"name":{json.dumps(name)},"cat":"span","args":{args}}}'


def _end(pid: int, tid: int, ts: int, name: str) -> str:
    return f'{{"ph":"E","pid":{pid},"tid":{tid},"ts":{_us(ts)},"name":{json.dumps(name)},"cat":"span"}}'
