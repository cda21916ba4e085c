"""What ``tracetool info`` and ``validate`` say about a trace, as plain data."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tracetool.reader import Trace
from tracetool.schema import TABLES


def request_ids(trace: Trace) -> set[str]:
    """Every request id named in spans, tokens or requests (the empty id is not a request)."""
    ids: set[str] = set()
    for name in ("spans", "tokens", "requests"):
        if trace.has(name) and trace.rows(name):
            ids.update(v for v in pc.unique(trace.table(name).column("request_id")).to_pylist() if v)
    return ids


def server_time_span_ns(trace: Trace) -> tuple[int, int] | None:
    """First and last server-clock timestamp in spans and tokens, if any."""
    lo: list[int] = []
    hi: list[int] = []
    spans = trace.table("spans")
    if spans.num_rows:
        server = spans.filter(pc.equal(spans.column("clock"), "server"))
        if server.num_rows:
            lo.append(pc.min(server.column("start_ns")).as_py())
            hi.append(pc.max(server.column("end_ns")).as_py())
    tokens = trace.table("tokens")
    if tokens.num_rows:
        lo.append(pc.min(tokens.column("emit_ns")).as_py())
        hi.append(pc.max(tokens.column("emit_ns")).as_py())
    if not lo:
        return None
    return min(lo), max(hi)


def summarize(trace: Trace) -> dict[str, Any]:
    """The facts ``tracetool info`` prints (and emits with ``--json``)."""
    span = server_time_span_ns(trace)
    spans = trace.table("spans")
    clocks = sorted(set(pc.unique(spans.column("clock")).to_pylist())) if spans.num_rows else []
    tokens = trace.table("tokens")
    with_tokens = len(pc.unique(tokens.column("request_id"))) if tokens.num_rows else 0
    return {
        "path": str(trace.path),
        "version": trace.meta.get("version"),
        "closed": trace.meta.get("closed"),
        "requests": len(request_ids(trace)),
        "requests_with_tokens": with_tokens,
        "tokens": tokens.num_rows,
        "span_names": _counts(spans.column("name")) if spans.num_rows else {},
        "clocks": clocks,
        "server_time_span_s": None if span is None else (span[1] - span[0]) / 1e9,
        # imported client-side files copy the client clock into emit_ns (docs/importers.md)
        "time_span_clock": ((trace.meta.get("import") or {}).get("emit_ns_clock") or "server")
        if isinstance(trace.meta.get("import"), dict) else "server",
        "tables": {name: {"rows": t.num_rows, "files": [p.name for p in trace.files.get(name, [])],
                          "known": name in TABLES}
                   for name, t in trace.tables.items()},
        "model": trace.meta.get("model"),
        "hardware": trace.meta.get("hardware"),
        "notes": trace.meta.get("notes") or [],
        "dropped_rows": trace.meta.get("dropped_rows") or {},
        "warnings": trace.warnings,
    }


def _counts(col: pa.ChunkedArray) -> dict[str, int]:
    vc = pc.value_counts(col)
    return {str(v["values"]): int(v["counts"]) for v in vc.to_pylist()}
