"""Received spans -> rows of a v1 trace, grouped per request.

Spans of one request arrive in pieces: an exporter batches spans as they
*end*, so children (vLLM's ``llm_core``, SGLang's stage slices) usually
arrive before the request's root span, sometimes in another export. The sink
therefore keeps, per trace id, the names and parents of the spans it saw and
the spans it could not yet place; a span belongs to the request whose root it
descends from (:func:`tracetool.otlp.mapping.request_root`). A span is written
once its request is known; spans whose trace never names a request are
written to ``otlp_spans`` only (with a null ``request_id``) when their trace
has been quiet for ``idle_s`` seconds, or when the sink closes. A trace with
exactly one request takes its stray spans too (``otlp:<name>``).

Everything received is written: the mapped rows to ``spans`` / ``requests``,
and every span as it came to ``otlp_spans`` (the trace id per request is what
``tracetool merge`` joins on). Counts land in ``meta.json`` (``otlp``) and
notes.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from tracetool.otlp.decode import OtelSpan
from tracetool.otlp.mapping import (
    Root,
    Rows,
    gives_phases_as_child,
    map_child,
    map_root,
    request_root,
)
from tracetool.writer import TraceWriter

#: Longest string attribute value kept in ``otlp_spans.attributes``.
MAX_ATTR_CHARS = 256
#: Attribute keys that carry message contents (GenAI conventions, TGI's per-token ``generation``):
#: never written to the trace.
_CONTENT_KEY = re.compile(r"(^|[._])(prompt|completion|messages|content|system_instructions|generation|text)"
                          r"(s)?([._]\d+)?($|\.)", re.IGNORECASE)
#: Parent hops followed to find a span's request (a cycle or a runaway chain stops here).
MAX_HOPS = 64


@dataclass
class _Trace:
    #: span id -> (name, parent span id) of every span seen in this trace
    names: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    #: root span id -> (request id, whether the root gave the phases itself)
    roots: dict[str, tuple[str, bool]] = field(default_factory=dict)
    pending: list[OtelSpan] = field(default_factory=list)
    last: float = 0.0


@dataclass
class SinkStats:
    payloads: int = 0
    spans: int = 0
    requests: int = 0
    requests_error: int = 0
    spans_without_request: int = 0
    refused_payloads: int = 0
    preempted_requests: int = 0
    duplicates: int = 0
    unusable: list[str] = field(default_factory=list)
    mappings: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"payloads": self.payloads, "spans": self.spans, "requests": self.requests,
                "requests_error": self.requests_error,
                "spans_without_request": self.spans_without_request,
                "refused_payloads": self.refused_payloads, "preempted_requests": self.preempted_requests,
                "duplicates": self.duplicates,
                "mappings": dict(sorted(self.mappings.items()))}


class OtlpSink:
    """Feed it decoded spans (:meth:`accept`, from any thread); :meth:`close` places the rest.

    Args:
        writer: a started :class:`~tracetool.writer.TraceWriter`; the sink does not close it.
        idle_s: a trace quiet this long gets its unplaced spans written.
        max_traces: traces remembered; beyond it the quietest is settled and forgotten.
    """

    def __init__(self, writer: TraceWriter, *, idle_s: float = 10.0, max_traces: int = 50_000) -> None:
        self.writer = writer
        self.idle_s = idle_s
        self.max_traces = max_traces
        self.stats = SinkStats()
        self._traces: OrderedDict[str, _Trace] = OrderedDict()
        self._request_ids: set[str] = set()
        self._lock = threading.Lock()
        for table in ("spans", "requests", "otlp_spans"):
            writer.sink(table)  # declared: a receiver that got nothing still wrote a valid, empty trace

    # -- input ------------------------------------------------------------------------------------
    def accept(self, spans: list[OtelSpan]) -> None:
        """Place what can be placed now; remember the rest."""
        out = _Out(self.stats)
        with self._lock:
            self.stats.payloads += 1
            self.stats.spans += len(spans)
            now = time.monotonic()
            touched: dict[str, _Trace] = {}
            for sp in spans:
                tr = self._traces.get(sp.trace_id)
                if tr is None:
                    tr = self._traces[sp.trace_id] = _Trace()
                self._traces.move_to_end(sp.trace_id)
                tr.last = now
                if sp.span_id in tr.names:  # sent again (an exporter retrying after a timeout): once only
                    self.stats.duplicates += 1
                    continue
                tr.names[sp.span_id] = (sp.name, sp.parent_span_id)
                tr.pending.append(sp)
                touched[sp.trace_id] = tr
            for tid, tr in touched.items():
                self._place(tid, tr, out)
            while len(self._traces) > self.max_traces:
                tid, tr = self._traces.popitem(last=False)
                self._settle(tid, tr, out)
        self._write(out)

    def tick(self) -> None:
        """Settle the traces that have been quiet for ``idle_s`` (the receiver calls it every second)."""
        out = _Out(self.stats)
        with self._lock:
            now = time.monotonic()
            for tid in list(self._traces):
                tr = self._traces[tid]
                if now - tr.last < self.idle_s:
                    break  # ordered by last activity
                if tr.pending:
                    self._settle(tid, tr, out)
                if now - tr.last > 6 * self.idle_s:  # late children after a minute: a new trace entry
                    del self._traces[tid]
        self._write(out)

    def refused(self) -> None:
        with self._lock:
            self.stats.refused_payloads += 1

    def close(self) -> None:
        """Place every span still waiting, and write the counts to ``meta.json``."""
        out = _Out(self.stats)
        with self._lock:
            for tid, tr in self._traces.items():
                self._settle(tid, tr, out)
            self._traces.clear()
        self._write(out)
        self.writer.update_meta(otlp=self.stats.as_dict())
        s = self.stats
        if s.spans_without_request:
            self.writer.note(f"otlp: {s.spans_without_request} span(s) belong to no request (their trace named "
                             "none): kept in otlp_spans only")
        if s.refused_payloads:
            self.writer.note(f"otlp: {s.refused_payloads} payload(s) refused as malformed (the senders got a 4xx)")
        if s.unusable:
            shown = "; ".join(s.unusable[:5]) + (f"; and {len(s.unusable) - 5} more" if len(s.unusable) > 5 else "")
            self.writer.note(f"otlp: unusable attribute values ignored: {shown}")
        if s.preempted_requests:
            self.writer.note(f"otlp: {s.preempted_requests} request(s) were preempted (vLLM journey events); "
                             "their time waiting again counts as queue")

    # -- placing ------------------------------------------------------------------------------------
    def _place(self, tid: str, tr: _Trace, out: _Out) -> None:
        new_roots: list[tuple[OtelSpan, Root]] = []
        for sp in tr.pending:
            root = request_root(sp)
            if root is not None and sp.span_id not in tr.roots:
                rid = self._new_request_id(root.request_id, tid, sp.span_id)
                tr.roots[sp.span_id] = (rid, False)
                new_roots.append((sp, root))
        if not tr.roots:
            return
        placed: dict[str, list[OtelSpan]] = {}
        waiting: list[OtelSpan] = []
        root_ids = {sp.span_id for sp, _ in new_roots}
        for sp in tr.pending:
            if sp.span_id in root_ids:
                continue
            owner = self._owner(tr, sp)
            if owner is None:
                waiting.append(sp)
            else:
                placed.setdefault(owner, []).append(sp)
        tr.pending = waiting
        for sp, root in new_roots:
            rid, _ = tr.roots[sp.span_id]
            kids = placed.get(sp.span_id, [])
            by_children = any(gives_phases_as_child(k, self._parent_name(tr, k)) for k in kids)
            rows, gave = map_root(sp, root, rid, children_give_phases=by_children)
            tr.roots[sp.span_id] = (rid, gave)
            out.add(rows, self.stats)
            out.raw(sp, rid, root.kind)
            self.stats.requests += 1
            if rows.requests.get(rid, {}).get("status") == "error":
                self.stats.requests_error += 1
        for owner, kids in placed.items():
            rid, gave = tr.roots[owner]
            for k in kids:
                rows, how = map_child(k, rid, self._parent_name(tr, k), root_gave_phases=gave)
                out.add(rows, self.stats)
                out.raw(k, rid, how)

    def _settle(self, tid: str, tr: _Trace, out: _Out) -> None:
        """A quiet trace's unplaced spans: to its one request, or to otlp_spans alone."""
        only = next(iter(tr.roots.values())) if len(tr.roots) == 1 else None
        for sp in tr.pending:
            if only is not None:
                rows, how = map_child(sp, only[0], self._parent_name(tr, sp), root_gave_phases=True)
                out.add(rows, self.stats)
                out.raw(sp, only[0], how)
            else:
                self.stats.spans_without_request += 1
                out.raw(sp, None, "none")
        tr.pending = []

    def _owner(self, tr: _Trace, sp: OtelSpan) -> str | None:
        p = sp.parent_span_id
        for _ in range(MAX_HOPS):
            if p is None:
                return None
            if p in tr.roots:
                return p
            entry = tr.names.get(p)
            if entry is None:
                return None
            p = entry[1]
        return None

    @staticmethod
    def _parent_name(tr: _Trace, sp: OtelSpan) -> str | None:
        entry = tr.names.get(sp.parent_span_id) if sp.parent_span_id else None
        return entry[0] if entry else None

    def _new_request_id(self, own: str | None, trace_id: str, span_id: str) -> str:
        """The server's id; else the trace id; made unique where a server repeats one."""
        rid = own or trace_id
        if rid in self._request_ids:
            rid = f"{rid}/{span_id}"
        self._request_ids.add(rid)
        return rid

    # -- output --------------------------------------------------------------------------------------
    def _write(self, out: _Out) -> None:
        w = self.writer
        if out.spans:
            w.sink("spans").append_batch({
                "request_id": [r[0] for r in out.spans], "name": [r[1] for r in out.spans],
                "start_ns": [r[2] for r in out.spans], "end_ns": [r[3] for r in out.spans],
                "clock": ["server"] * len(out.spans)})
        if out.requests:
            rids = list(out.requests)
            cols = ("prompt_tokens", "output_tokens", "status", "error", "server_scope")
            w.sink("requests").append_batch({"request_id": rids,
                                             **{c: [out.requests[r].get(c) for r in rids] for c in cols}})
        if out.otlp:
            names = ("trace_id", "span_id", "parent_span_id", "request_id", "name", "kind", "service", "scope",
                     "start_ns", "end_ns", "status", "mapping", "attributes")
            w.sink("otlp_spans").append_batch({n: [row[i] for row in out.otlp] for i, n in enumerate(names)})


class _Out:
    """Rows gathered under the lock, written after it."""

    def __init__(self, stats: SinkStats) -> None:
        self.stats = stats
        self.spans: list[tuple[str, str, int, int]] = []
        self.requests: dict[str, dict[str, Any]] = {}
        self.otlp: list[tuple[Any, ...]] = []

    def add(self, rows: Rows, stats: SinkStats) -> None:
        self.spans += rows.spans
        for rid, info in rows.requests.items():
            self.requests.setdefault(rid, {}).update(info)
        stats.preempted_requests += len(rows.preemptions)
        if len(stats.unusable) < 100:
            stats.unusable += rows.unusable

    def raw(self, sp: OtelSpan, rid: str | None, mapping: str) -> None:
        self.stats.mappings[mapping] = self.stats.mappings.get(mapping, 0) + 1
        self.otlp.append((sp.trace_id, sp.span_id, sp.parent_span_id, rid, sp.name, sp.kind, sp.service,
                          sp.scope, sp.start_ns, sp.end_ns, sp.status, mapping, safe_attributes(sp.attributes)))


def safe_attributes(attrs: dict[str, Any]) -> str:
    """The attributes as JSON: scalars and short strings; message contents left out, long strings cut."""
    keep: dict[str, Any] = {}
    for k, v in attrs.items():
        if _CONTENT_KEY.search(k) and not isinstance(v, (int, float)):
            continue
        if isinstance(v, (dict, list)):
            v = json.dumps(v, default=str)
        if isinstance(v, str) and len(v) > MAX_ATTR_CHARS:
            v = v[:MAX_ATTR_CHARS] + "…"
        keep[k] = v
    return json.dumps(keep, ensure_ascii=False, default=str)
