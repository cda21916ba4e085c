"""Join a client trace and a server trace of the same run into one trace, per request id.

``tracetool probe`` writes what the client saw; a server running tracetool's
collectors (``tracetool serve``, or the ASGI middleware in a user's app) writes
what the server did, under the same request ids (the probe sends them as
``X-Request-ID``). The merged trace holds:

* every table of both traces that the join does not build (:func:`other_tables`): a table one
  side has as it is (the server's gpu, stacks, steps; the probe's ``server_metrics``); a table
  both have concatenated where a ``clock`` column tells their rows apart (``server_metrics``
  scraped by the probe and by the server's recording process), else the server trace's, and a
  note in ``meta.json`` and in the report (:attr:`MergeReport.not_kept`) says what was left out;
* the client trace's ``client``-clock spans (``client.request``,
  ``client.connect``, ...);
* ``tokens.client_recv_ns`` filled from the client trace (see
  :func:`receipt_times`): the k-th content chunk ↔ token k when the counts
  match, else each token gets the chunk sent nearest after it existed
  (:func:`chunk_of_tokens`);
* ``requests`` rows joined: the server's sizes, the client's outcome when the
  client saw an error the server did not;
* for requests only the client knows (the server trace missed them), the
  client trace's rows, its estimated server spans shifted onto the server
  clock by the median offset;
* for requests the server made no token rows for (a middleware around a loop
  that is not instrumented), the client's rows, one per content chunk, placed
  on the server clock (:func:`_client_tokens`);
* a ``clock_offsets`` table (an extra table of the format): per joined
  request, ``offset_ns`` = server clock − client clock, estimated as NTP does
  under the symmetric-delay assumption from the four timestamps of the
  request (client send t1, server receive t2, server send t3, client receive
  t4): ((t2 − t1) + (t3 − t4)) / 2, and ``network_ns`` = (t4 − t1) − (t3 − t2).
  The offset is for drawing a joined timeline only: network time is always
  the difference of the two durations, never a difference of timestamps.
"""

from __future__ import annotations

import bisect
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tracetool import schema
from tracetool.errors import BadInput, one_line
from tracetool.meta import write_meta
from tracetool.otlp.join import align_request_ids
from tracetool.reader import Trace, open_trace
from tracetool.schema import CLIENT_REQUEST, SERVER_REQUEST, TABLES, table_file_name
from tracetool.summary import request_ids
from tracetool.writer.output import check_output, prepare_output

#: The table merge writes (an optional table of the format, docs/trace-format.md).
CLOCK_OFFSETS = schema.CLOCK_OFFSETS.arrow_schema


@dataclass
class MergeReport:
    out: Path
    client_requests: int
    server_requests: int
    joined: int
    client_only: int
    server_only: int
    tokens_with_recv: int
    offset_ns_median: int | None
    #: how requests were matched (tracetool.otlp.join.IdJoin.as_dict): by id, trace id, embedded id;
    #: why the others were not
    id_join: dict[str, Any] | None = None
    #: one line per table (or meta.json key) of the inputs the merged trace could not keep, and why
    not_kept: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in self.__dict__.items()}


def _bounds(spans: pa.Table, name: str, clock: str) -> dict[str, tuple[int, int]]:
    """request id -> (first start, last end) of spans ``name`` on ``clock``."""
    mask = pc.and_(pc.equal(spans.column("name"), name), pc.equal(spans.column("clock"), clock))
    sel = spans.filter(mask)
    if not sel.num_rows:
        return {}
    g = sel.group_by("request_id").aggregate([("start_ns", "min"), ("end_ns", "max")])
    return {r: (s, e) for r, s, e in zip(g.column("request_id").to_pylist(), g.column("start_ns_min").to_pylist(),
                                         g.column("end_ns_max").to_pylist(), strict=True)}


def clock_offsets(client_spans: pa.Table, server_spans: pa.Table) -> pa.Table:
    """Per request in both: NTP-style offset (server − client) and network time, in ns."""
    c = _bounds(client_spans, CLIENT_REQUEST, "client")
    s = _bounds(server_spans, SERVER_REQUEST, "server")
    ids = sorted(set(c) & set(s))
    offsets, network = [], []
    for rid in ids:
        t1, t4 = c[rid]
        t2, t3 = s[rid]
        offsets.append(((t2 - t1) + (t3 - t4)) // 2)
        network.append((t4 - t1) - (t3 - t2))
    return pa.table([pa.array(ids, pa.string()), pa.array(offsets, pa.int64()), pa.array(network, pa.int64())],
                    schema=CLOCK_OFFSETS)


def merge_traces(client_path: str | Path, server_path: str | Path, out: str | Path, *,
                 force: bool = False) -> MergeReport:
    """Write the joined trace to ``out``; see the module docstring."""
    out = Path(out)
    check_output(out, force)
    client, server = open_trace(client_path), open_trace(server_path)
    if not _has_clock(client, "client"):
        raise BadInput(f"{client.path}: no client-clock spans: not a client trace (tracetool probe writes one)")
    # servers that keep their own request ids: matched on the traceparent's trace id (tracetool.otlp.join)
    server, id_join = align_request_ids(client, server)
    c_ids, s_ids = request_ids(client), request_ids(server)
    joined = c_ids & s_ids
    offsets = clock_offsets(client.table("spans"), server.table("spans"))
    off_list = offsets.column("offset_ns").to_pylist()
    median = int(statistics.median(off_list)) if off_list else None
    client_only = c_ids - s_ids

    tables, not_kept = other_tables(client, server)
    tables["spans"] = _spans(client, server, client_only, median or 0)
    tables["tokens"], with_recv, from_client = _tokens(client, server, median or 0, offsets)
    tables["requests"] = _requests(client, server)
    tables["clock_offsets"] = offsets

    meta = {k: v for k, v in server.meta.items() if k not in ("closed", "dropped_rows")}
    not_kept += _client_meta(client.meta, meta)
    notes = list(server.meta.get("notes") or [])
    notes += [n for n in client.meta.get("notes") or [] if n not in notes]
    if from_client:
        notes.append(f"tokens of {from_client} request(s) are the client's content chunks (the server trace "
                     "has no token rows for them): emit_ns is estimated from each chunk's receipt time")
    clocks = dict(server.meta.get("clocks") or {})
    if "client" in (client.meta.get("clocks") or {}):
        clocks["client"] = client.meta["clocks"]["client"]
    report = MergeReport(out, len(c_ids), len(s_ids), len(joined), len(client_only), len(s_ids - c_ids),
                         with_recv, median, id_join.as_dict(), not_kept)
    notes += [n for n in id_join.lines() if n not in notes]
    notes += [n for n in not_kept if n not in notes]
    meta.update(notes=notes, clocks=clocks, closed=True, dropped_rows={},
                merge={"client": str(client.path), "server": str(server.path),
                       **{k: v for k, v in report.as_dict().items() if k not in ("out", "not_kept")}})
    if "probe" in client.meta:
        meta["probe"] = client.meta["probe"]
    _write(out, meta, tables)
    return report


#: Tables the join builds from both sides (the rest are kept by :func:`other_tables`).
JOINED = ("spans", "tokens", "requests", "clock_offsets")
#: meta.json keys merge writes itself, or that say how one recording went (the server's are kept).
_OWN_META = ("format", "version", "created_unix_ns", "producer", "closed", "dropped_rows", "notes", "clocks",
             "merge", "probe")


def other_tables(client: Trace, server: Trace) -> tuple[dict[str, pa.Table], list[str]]:
    """Every table of both traces but the joined ones, and a line for each set of rows not kept.

    A table one side has (or only one side has rows in) is kept as it is. A table both have rows
    in is concatenated where its ``clock`` column tells the two sides' rows apart: a probe's
    ``server_metrics`` (client clock) beside those the server's recording process scraped
    (server clock). Rows of a clock both sides use, a table without a clock (two hosts' gpu
    samples, step ids that would collide) or columns that do not agree cannot be told apart or
    joined: the server trace's rows are kept, and the line says what was left out.
    """
    tables: dict[str, pa.Table] = {}
    not_kept: list[str] = []
    for name in sorted(set(client.table_names()) | set(server.table_names())):
        c = client.table(name) if client.has(name) else None
        s = server.table(name) if server.has(name) else None
        if name == "clock_offsets":
            old = sum(t.num_rows for t in (c, s) if t is not None)
            if old:
                not_kept.append(f"clock_offsets: estimated again from the joined requests; the inputs' "
                                f"{old:,} row(s) not kept")
            continue
        if name in JOINED:
            continue
        if s is not None and (c is None or not c.num_rows):
            tables[name] = s
        elif c is not None and (s is None or not s.num_rows):
            tables[name] = c
        elif c is not None and s is not None:
            tables[name], why = _both(name, c, s)
            if why:
                not_kept.append(why)
    return tables, not_kept


def _both(name: str, c: pa.Table, s: pa.Table) -> tuple[pa.Table, str | None]:
    """A table both traces have rows in: the rows kept, and why some of the client's were not."""
    def lost(why: str, rows: int) -> str:
        return f"{name}: {why}: the server trace's {s.num_rows:,} row(s) kept, {rows:,} row(s) of the client " \
            "trace not kept"

    if "clock" not in c.column_names or "clock" not in s.column_names:
        return s, lost("both traces have this table and no clock column tells their rows apart", c.num_rows)
    shared = set(pc.unique(c.column("clock")).to_pylist()) & set(pc.unique(s.column("clock")).to_pylist())
    kept = c
    if shared:
        same = pc.is_in(c.column("clock"), value_set=pa.array(list(shared), c.schema.field("clock").type),
                        skip_nulls=False)
        kept = c.filter(pc.invert(same))
    clocks = ", ".join(sorted("unnamed" if x is None else str(x) for x in shared))
    why = lost(f"both traces hold rows on the {clocks} clock, which cannot be told apart",
               c.num_rows - kept.num_rows) if shared else None
    if not kept.num_rows:
        return s, why
    try:
        return pa.concat_tables([s, kept], promote_options="permissive"), why
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        return s, lost(f"the two traces' columns do not agree ({one_line(e, 200)})", c.num_rows)


def _client_meta(client: dict[str, Any], meta: dict[str, Any]) -> list[str]:
    """Copy into ``meta`` (the server trace's) the client trace's meta.json keys it lacks (the
    probe's ``server_metrics`` block: URL, interval, scrapes); a line for each key both have
    with different values, where the server's is kept."""
    out = []
    for k, v in client.items():
        if k in _OWN_META:
            continue
        if k not in meta:
            meta[k] = v
        elif meta[k] != v:
            out.append(f"meta.json {k}: both traces have it and they differ: the server trace's kept, "
                       "the client trace's not kept")
    return out


def _has_clock(trace: Trace, clock: str) -> bool:
    spans = trace.table("spans")
    return bool(spans.num_rows) and bool(pc.any(pc.equal(spans.column("clock"), clock)).as_py())


def _in(col: pa.ChunkedArray, ids: set[str]) -> pa.ChunkedArray:
    return pc.is_in(col, value_set=pa.array(sorted(ids), pa.string()))


def _spans(client: Trace, server: Trace, client_only: set[str], shift: int) -> pa.Table:
    schema = TABLES["spans"].arrow_schema
    cs = client.table("spans").select(schema.names).cast(schema)
    ss = server.table("spans").select(schema.names).cast(schema)
    parts = [ss, cs.filter(pc.equal(cs.column("clock"), "client"))]
    if client_only:
        # estimated server spans of requests the server trace does not have: onto the server clock
        est = cs.filter(pc.and_(pc.equal(cs.column("clock"), "server"), _in(cs.column("request_id"), client_only)))
        if est.num_rows:
            for col in ("start_ns", "end_ns"):
                est = est.set_column(schema.get_field_index(col), col, pc.add(est.column(col), shift))
            parts.append(est.cast(schema))
    return pa.concat_tables(parts)


def _tokens(client: Trace, server: Trace, shift: int, offsets: pa.Table) -> tuple[pa.Table, int, int]:
    """(tokens table, rows with a receipt time, requests whose rows are the client's)."""
    ct, st = client.table("tokens"), server.table("tokens")
    schema = TABLES["tokens"].arrow_schema
    st = st.select(schema.names).cast(schema)
    if st.num_rows and ct.num_rows:
        recv = receipt_times(ct, st, offsets)
        st = st.set_column(schema.get_field_index("client_recv_ns"), "client_recv_ns", pa.array(recv, pa.int64()))
    parts = [st]
    # requests the server made no token rows for: a server the middleware wraps but whose loop is
    # not instrumented, or requests its trace missed. The client's chunks are all there is.
    bare = set(pc.unique(ct.column("request_id")).to_pylist()) - set(pc.unique(st.column("request_id")).to_pylist())
    bare.discard(None)
    if bare:
        parts.append(_client_tokens(ct.filter(_in(ct.column("request_id"), bare)), offsets, shift))
    out = pa.concat_tables(parts)
    with_recv = out.num_rows - out.column("client_recv_ns").null_count
    return out, with_recv, len(bare)


def _client_tokens(ct: pa.Table, offsets: pa.Table, shift: int) -> pa.Table:
    """Client token rows (one per content chunk) on the server clock.

    ``emit_ns`` becomes when the server sent the chunk, estimated as :func:`receipt_times`
    places chunks: the receipt time plus the request's clock offset less half its network
    time. A request without an offset (no ``server.request`` on one side) keeps the client's
    own estimate, shifted by the median offset. ``client_recv_ns`` stays as measured.
    """
    schema = TABLES["tokens"].arrow_schema
    off = {r: (o, n) for r, o, n in zip(offsets.column("request_id").to_pylist(),
                                        offsets.column("offset_ns").to_pylist(),
                                        offsets.column("network_ns").to_pylist(), strict=True)}
    emit = []
    for rid, e, t in zip(ct.column("request_id").to_pylist(), ct.column("emit_ns").to_pylist(),
                         ct.column("client_recv_ns").to_pylist(), strict=True):
        if rid in off and t is not None:
            theta, network = off[rid]
            emit.append(t + theta - network // 2)
        else:
            emit.append(e + shift)
    ct = ct.set_column(ct.schema.get_field_index("emit_ns"), "emit_ns", pa.array(emit, pa.int64()))
    return ct.select(schema.names).cast(schema)


def receipt_times(client_tokens: pa.Table, server_tokens: pa.Table, offsets: pa.Table) -> list[int | None]:
    """``client_recv_ns`` for each server token row (existing values kept where the client has none).

    Per request: when the client received as many content chunks as the server
    made tokens, chunk k is token k. Otherwise (a token whose text was held
    back, e.g. half a UTF-8 character, arrives with a later chunk; an EOS
    token sends no text) the chunks are put on the server clock with the
    request's clock offset and half its network time (symmetric delay), and
    :func:`chunk_of_tokens` says which chunk carried each token.
    """
    chunks: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for rid, idx, t in zip(client_tokens.column("request_id").to_pylist(),
                           client_tokens.column("index").to_pylist(),
                           client_tokens.column("client_recv_ns").to_pylist(), strict=True):
        if t is not None:
            chunks[rid].append((idx, t))
    off = {r: (o, n) for r, o, n in zip(offsets.column("request_id").to_pylist(),
                                        offsets.column("offset_ns").to_pylist(),
                                        offsets.column("network_ns").to_pylist(), strict=True)}
    rids = server_tokens.column("request_id").to_pylist()
    index = server_tokens.column("index").to_pylist()
    emit = server_tokens.column("emit_ns").to_pylist()
    out: list[int | None] = server_tokens.column("client_recv_ns").to_pylist()
    rows: dict[str, list[int]] = defaultdict(list)
    for i, rid in enumerate(rids):
        rows[rid].append(i)
    for rid, positions in rows.items():
        got = sorted(chunks.get(rid, ()))
        if not got:
            continue
        positions.sort(key=lambda i: index[i])
        times = [t for _, t in got]
        if len(times) == len(positions) or rid not in off:
            for i, t in zip(positions, times, strict=False):
                out[i] = t
            continue
        theta, network = off[rid]
        sent = [t + theta - network // 2 for t in times]  # when the server sent each chunk (estimate)
        for i, k in zip(positions, chunk_of_tokens([emit[i] for i in positions], sent), strict=True):
            out[i] = times[k] if k is not None else None
    return out


def chunk_of_tokens(emits: list[int], sent: list[int]) -> list[int | None]:
    """Which chunk carried each token: ``emits`` of one request's tokens in index order,
    ``sent`` its chunks' estimated send times on the same clock, in order.

    A chunk leaves microseconds after the token that completes its text, but the estimate of
    its send time is off by the clock-offset error (hundreds of us to ms, either way). "The
    first chunk sent after the token" therefore moves a token onto the next chunk whenever the
    estimate is early, one inter-token gap late (seen on every EOS-ended request of a real run).
    Instead a token's chunk is the first one sent after the midpoint between the previous
    token's emit (the previous distinct one: a speculative step emits several at once) and its
    own: it tolerates an error of half an inter-token gap either way. A token whose text was held
    back gets the next chunk; tokens after the last chunk (an EOS) get None.
    """
    out: list[int | None] = []
    prev: int | None = None  # the latest emit before the current token's
    cur: int | None = None
    floor = 0  # chunks are in order: a token never maps before the previous token's chunk
    for e in emits:
        if cur is not None and e > cur:
            prev = cur
        if cur is None or e > cur:
            cur = e
        k = 0 if prev is None else bisect.bisect_left(sent, (prev + e) // 2)
        k = max(k, floor)
        if k >= len(sent):
            out.append(None)
            continue
        floor = k
        out.append(k)
    return out


def _requests(client: Trace, server: Trace) -> pa.Table:
    schema = TABLES["requests"].arrow_schema
    rows: dict[str, dict[str, Any]] = {}
    for r in server.table("requests").to_pylist():
        rows.setdefault(r["request_id"], {}).update({k: v for k, v in r.items() if v is not None})
    for r in client.table("requests").to_pylist():
        cur = rows.setdefault(r["request_id"], {})
        for k, v in r.items():
            if v is None:
                continue
            if k in ("status", "error"):
                if r.get("status") == "error":  # the client saw a failure the server may not have
                    cur[k] = v
                else:
                    cur.setdefault(k, v)
            else:
                cur.setdefault(k, v)
    cols = {f.name: [rows[rid].get(f.name) for rid in rows] for f in schema}
    cols["request_id"] = list(rows)
    return pa.table(cols, schema=schema)


def _write(out: Path, meta: dict[str, Any], tables: dict[str, pa.Table]) -> None:
    try:
        prepare_output(out, force=True)  # checked before the inputs were read
        for name, table in tables.items():
            path = out / table_file_name(name, "arrows")
            options = pa.ipc.IpcWriteOptions(compression="lz4")
            with pa.OSFile(str(path), "wb") as f, pa.ipc.new_stream(f, table.schema, options=options) as w:
                w.write_table(table)
        write_meta(out, meta)
    except OSError as e:
        raise BadInput(f"{out}: cannot write the merged trace ({e.strerror or e})") from e
