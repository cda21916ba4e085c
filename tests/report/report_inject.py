"""Inject a decode regression into any v1 trace: every inter-token gap x factor.

Works on recorded, merged and imported traces alike. Per request and per clock,
a time t maps to ``first + factor * (t - first)`` between its first and last
token and to ``t + extra`` after the last token (extra = the added decode
time), so decode spans stretch, request spans end later, and TTFT is unchanged.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa

from tracetool.reader import open_trace


def slow_itl(src: Path, dst: Path, factor: float) -> Path:
    trace = open_trace(src)
    shutil.copytree(src, dst)
    for f in dst.iterdir():
        if f.name != "meta.json":
            f.unlink()
    tok = trace.table("tokens")
    spans = trace.table("spans")
    rid = np.asarray(tok["request_id"].to_pylist(), dtype=object)
    idx = tok["index"].to_numpy()
    emit = tok["emit_ns"].to_numpy().astype(np.int64)
    recv = tok["client_recv_ns"].to_numpy(zero_copy_only=False) if "client_recv_ns" in tok.column_names else None
    recv_valid = None if recv is None else tok["client_recv_ns"].is_valid().to_numpy(zero_copy_only=False)
    # per request: (first, last) on each clock
    bounds: dict[tuple[str, str], tuple[int, int]] = {}
    rows: dict[str, list[int]] = {}
    for i, r in enumerate(rid.tolist()):
        rows.setdefault(r, []).append(i)
    for r, members in rows.items():
        first = min(members, key=lambda i: idx[i])
        last = max(members, key=lambda i: idx[i])
        bounds[(r, "server")] = (int(emit[first]), int(emit[last]))
        if recv is not None and recv_valid[first] and recv_valid[last]:
            bounds[(r, "client")] = (int(recv[first]), int(recv[last]))
    imported = trace.meta.get("import", {}).get("emit_ns_clock") == "client"
    if imported:  # emit_ns is a copy of the client time: its spans are on the client clock
        for r in set(rid.tolist()):
            bounds[(r, "client")] = bounds[(r, "server")]

    def stretch(t: int, key: tuple[str, str]) -> int:
        if key not in bounds:
            return t
        first, last = bounds[key]
        if t <= first:
            return t
        if t <= last:
            return first + round(factor * (t - first))
        return t + round((factor - 1) * (last - first))

    new_emit = [stretch(int(e), (str(r), "server")) for r, e in zip(rid, emit, strict=True)]
    cols = {n: tok[n] for n in tok.column_names}
    cols["emit_ns"] = pa.array(new_emit, pa.int64())
    if recv is not None:
        cols["client_recv_ns"] = pa.array([stretch(int(c), (str(r), "client")) if ok else None
                                           for r, c, ok in zip(rid, recv, recv_valid, strict=True)], pa.int64())
    tables = {name: trace.table(name) for name in trace.tables}
    tables["tokens"] = pa.table(cols)
    s_rid = spans["request_id"].to_pylist()
    s_clock = spans["clock"].to_pylist()
    starts = [stretch(int(t), (r, c)) for r, c, t in zip(s_rid, s_clock, spans["start_ns"].to_pylist(), strict=True)]
    ends = [stretch(int(t), (r, c)) for r, c, t in zip(s_rid, s_clock, spans["end_ns"].to_pylist(), strict=True)]
    sc = {n: spans[n] for n in spans.column_names}
    sc["start_ns"], sc["end_ns"] = pa.array(starts, pa.int64()), pa.array(ends, pa.int64())
    tables["spans"] = pa.table(sc)
    for name, table in tables.items():
        with pa.OSFile(str(dst / f"{name}.arrows"), "wb") as f, pa.ipc.new_stream(f, table.schema) as w:
            w.write_table(table)
    return dst
