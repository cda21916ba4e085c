"""Writing an imported benchmark as a v1 trace directory.

An import is a batch job over a finished file, so it writes the Arrow files
directly with pyarrow (in the canonical schemas of :mod:`tracetool.schema`)
instead of going through the streaming :class:`~tracetool.writer.TraceWriter`,
whose background flusher exists for live recorders. The result is an ordinary
closed trace that ``tracetool validate`` checks like any other.

Clock convention for client-only data: the v1 format requires ``tokens.emit_ns``
(server clock). A benchmark client never sees the server clock, so imported
traces set ``emit_ns`` to a copy of ``client_recv_ns`` and say so in
``meta.json`` (``import.emit_ns_clock = "client"`` and a note). Durations
between tokens are then the client-observed chunk gaps, which is exactly what
the source tools report as ITL.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pyarrow as pa

from tracetool import __version__
from tracetool.errors import BadInput
from tracetool.importers.common import ImportResult
from tracetool.meta import new_meta, write_meta
from tracetool.schema import CLIENT_REQUEST, TABLES
from tracetool.writer.output import prepare_output


def write_trace(result: ImportResult, out: Path, *, force: bool = False) -> dict[str, Any]:
    """Write ``result`` as a trace in ``out``; return a summary (counts, notes)."""
    spans: dict[str, list[Any]] = {"request_id": [], "name": [], "start_ns": [], "end_ns": [], "clock": []}
    tokens: dict[str, list[Any]] = {"request_id": [], "index": [], "emit_ns": [], "kv_len": [],
                                    "client_recv_ns": []}
    reqs: dict[str, list[Any]] = {"request_id": [], "prompt_tokens": [], "output_tokens": [],
                                  "status": [], "error": [], "prompt_chars": []}
    for r in result.requests:
        reqs["request_id"].append(r.request_id)
        reqs["prompt_tokens"].append(r.prompt_tokens)
        reqs["output_tokens"].append(r.output_tokens)
        reqs["status"].append(r.status)
        reqs["error"].append(r.error)
        reqs["prompt_chars"].append(r.prompt_chars)
        if r.status != "ok" or r.start_ns is None or r.end_ns is None:
            continue
        spans["request_id"].append(r.request_id)
        spans["name"].append(CLIENT_REQUEST)
        spans["start_ns"].append(r.start_ns)
        spans["end_ns"].append(r.end_ns)
        spans["clock"].append("client")
        kv_ok = r.one_token_per_chunk and r.prompt_tokens is not None
        for i, t in enumerate(r.token_ns):
            tokens["request_id"].append(r.request_id)
            tokens["index"].append(i)
            tokens["emit_ns"].append(t)
            tokens["client_recv_ns"].append(t)
            tokens["kv_len"].append(r.prompt_tokens + i if kv_ok and r.prompt_tokens is not None else None)

    prepare_output(out, force)
    tables = {"spans": spans, "tokens": tokens, "requests": reqs}
    try:
        for name, cols in tables.items():
            schema = TABLES[name].arrow_schema
            full = {c.name: cols.get(c.name, [None] * len(cols["request_id"])) for c in TABLES[name].columns}
            table = pa.Table.from_pydict(full, schema=schema)
            with pa.OSFile(str(out / f"{name}.arrows"), "wb") as f, pa.ipc.new_stream(f, schema) as w:
                w.write_table(table)
        write_meta(out, build_meta(result))
    except OSError as e:
        raise BadInput(f"{out}: cannot write ({e.strerror or e})") from e
    ok = sum(1 for r in result.requests if r.status == "ok")
    return {
        "path": str(out),
        "source": str(result.source),
        "tool": result.tool,
        "requests": len(result.requests),
        "requests_ok": ok,
        "requests_error": len(result.requests) - ok,
        "spans": len(spans["request_id"]),
        "tokens": len(tokens["request_id"]),
        "skipped": result.skipped,
        "timeline": result.timeline,
        "notes": result.notes,
    }


def build_meta(result: ImportResult) -> dict[str, Any]:
    """``meta.json`` of an imported trace: where it came from and what it cannot know."""
    clocks = {
        "client": {
            "epoch": "Unix epoch nanoseconds of the benchmark client host",
            "relative": "nanoseconds since the first request was sent (epoch unknown)",
            "synthetic": "nanoseconds since each request was sent (every request at its own zero)",
        }[result.timeline],
        "server": "not recorded (imported client-side benchmark file)",
    }
    details = dict(result.details)
    details.update({
        "tool": result.tool,
        "file": str(result.source.resolve()),
        "sha256": _sha256(result.source),
        "timeline": result.timeline,
        "emit_ns_clock": "client",
        "skipped": result.skipped,
    })
    return new_meta(
        producer={"name": "tracetool import", "version": __version__},
        clocks=clocks,
        notes=list(result.notes),
        closed=True,
        dropped_rows={},
        **{"import": details},
    )


def _sha256(path: Path) -> str | None:
    try:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        return h.hexdigest()
    except OSError:
        return None
