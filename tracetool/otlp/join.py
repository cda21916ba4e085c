"""Joining a probe's trace with a server trace whose request ids are the server's own.

Production servers keep their own request ids (vLLM: ``chatcmpl-<uuid>``), so
the probe's ids (``X-Request-ID``) are not found in what they publish. Two
things still tie a server request to the probe's:

1. the **W3C trace id**: the probe sends a ``traceparent`` per request whose
   trace id *is* the probe's request id (32 hex digits), and vLLM, SGLang and
   TGI parent their spans on it; a received trace records each request's
   trace id in ``otlp_spans``;
2. the probe's id **inside** the server's: vLLM builds its id from the
   client's ``X-Request-ID`` (``chatcmpl-<X-Request-ID>``), with a suffix in
   recent versions.

:func:`align_request_ids` renames the server's requests to the probe's ids
where one of these holds (after the plain equal-id join), and says how many
joined by which route and why the others did not; ``tracetool merge`` then
joins as usual.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tracetool.reader import Trace
from tracetool.summary import request_ids

_HEX32 = re.compile(r"[0-9a-f]{32}")


@dataclass
class IdJoin:
    """How the two traces' requests were matched."""

    by_request_id: int = 0
    by_trace_id: int = 0
    by_embedded_id: int = 0
    #: reason -> count, for client requests that found no server request
    client_unjoined: dict[str, int] = field(default_factory=dict)
    #: reason -> count, for server requests that found no client request
    server_unjoined: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def lines(self) -> list[str]:
        """One line per route and per reason, for stderr and meta.json notes."""
        out = []
        routes = [(self.by_trace_id, "on the W3C trace id of their traceparent"),
                  (self.by_embedded_id, "on the probe's id inside the server's own request id")]
        out += [f"merge: {n} request(s) joined {how}" for n, how in routes if n]
        out += [f"merge: {n} client request(s) not joined: {why}" for why, n in self.client_unjoined.items()]
        out += [f"merge: {n} server request(s) not joined: {why}" for why, n in self.server_unjoined.items()]
        return out


def align_request_ids(client: Trace, server: Trace) -> tuple[Trace, IdJoin]:
    """``server`` with its requests renamed to the client's ids where they match; see the module docstring."""
    c_ids, s_ids = request_ids(client), request_ids(server)
    report = IdJoin(by_request_id=len(c_ids & s_ids))
    taken = set(c_ids & s_ids)
    trace_of = _trace_ids(server)
    rename: dict[str, str] = {}
    ambiguous = 0
    for sid in sorted(s_ids - c_ids):
        tid = trace_of.get(sid)
        if tid is not None and tid in c_ids:
            if tid in taken:
                ambiguous += 1
                continue
            rename[sid] = tid
            taken.add(tid)
            report.by_trace_id += 1
            continue
        inside = [h for h in _HEX32.findall(sid) if h in c_ids and h not in taken]
        if len(inside) == 1:
            rename[sid] = inside[0]
            taken.add(inside[0])
            report.by_embedded_id += 1
    # why the rest did not join
    failed_early = _failed_before_server(client)
    has_otlp = server.rows("otlp_spans") > 0
    for cid in sorted(c_ids - taken):
        if cid in failed_early:
            why = "the request failed before reaching the server (connect failed)"
        elif has_otlp:
            why = ("no server span carries its trace id (not exported, sampled out, still in the exporter's "
                   "buffer when the receiver stopped, or the server started its own trace)")
        else:
            why = "its id is not in the server trace, and the server trace records no trace ids"
        report.client_unjoined[why] = report.client_unjoined.get(why, 0) + 1
    left = s_ids - c_ids - set(rename)
    if ambiguous:
        report.server_unjoined["its trace id is shared with another server request that joined"] = ambiguous
    rest = len(left) - ambiguous
    if rest > 0:
        why = ("its trace id is not one the probe sent (another client's traffic, or no traceparent reached "
               "the server)") if has_otlp else "its id matches no client request"
        report.server_unjoined[why] = rest
    if not rename:
        return server, report
    return dataclasses.replace(server, tables={n: _renamed(t, rename) for n, t in server.tables.items()}), report


def _trace_ids(server: Trace) -> dict[str, str]:
    """Server request id -> its trace id, from ``otlp_spans`` (the most frequent one per request)."""
    if not server.rows("otlp_spans"):
        return {}
    t = server.table("otlp_spans").select(["request_id", "trace_id"]).drop_null()
    counts: dict[str, Counter[str]] = {}
    for rid, tid in zip(t.column("request_id").to_pylist(), t.column("trace_id").to_pylist(), strict=True):
        counts.setdefault(rid, Counter())[tid] += 1
    return {rid: c.most_common(1)[0][0] for rid, c in counts.items()}


def _failed_before_server(client: Trace) -> set[str]:
    reqs = client.table("requests")
    if not reqs.num_rows or "error" not in reqs.column_names:
        return set()
    out = set()
    for rid, err in zip(reqs.column("request_id").to_pylist(), reqs.column("error").to_pylist(), strict=True):
        if isinstance(err, str) and err.startswith("connect failed"):
            out.add(rid)
    return out


def _renamed(table: pa.Table, rename: dict[str, str]) -> pa.Table:
    if "request_id" not in table.column_names:
        return table
    i = table.column_names.index("request_id")
    col = table.column(i)
    old = pa.array(list(rename), pa.string())
    new = pa.array(list(rename.values()), pa.string())
    idx = pc.index_in(col.cast(pa.string()), value_set=old)
    replaced = pc.if_else(pc.is_null(idx), col.cast(pa.string()), pc.take(new, idx))
    return table.set_column(i, table.field(i).with_type(pa.string()), replaced)
