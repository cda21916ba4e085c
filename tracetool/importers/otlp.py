"""``tracetool import otlp FILE``: OpenTelemetry traces saved as OTLP JSON, as a server-side trace.

The OpenTelemetry Collector's ``file`` exporter (``format: json``, the
default) writes one ``ExportTraceServiceRequest`` in the OTLP JSON encoding
per line; a file holding one such object (pretty-printed or not) reads too.
Each request goes through the same decoding and mapping as ``tracetool
receive`` (:mod:`tracetool.otlp`), so the trace is the one the receiver would
have written had the spans been sent to it: ``spans`` and ``requests`` on the
server's clock, every span in ``otlp_spans``.

Unlike the other importers, the result is a **server** trace: join it with a
probe's client trace with ``tracetool merge``. A line that is not a valid
OTLP request is skipped and counted in a note; a file with none is bad input.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tracetool import __version__
from tracetool.errors import BadInput
from tracetool.importers.common import Skips, json_lines, read_text

WHAT = "OTLP JSON traces (one ExportTraceServiceRequest per line, as the Collector's file exporter writes)"


def import_trace(path: Path, out: Path, *, force: bool = False) -> dict[str, Any]:
    """Read ``path`` and write the trace to ``out``; return the import summary."""
    from tracetool.otlp.decode import BadPayload, parse_json_request, spans_of
    from tracetool.otlp.sink import OtlpSink
    from tracetool.writer import TraceWriter
    from tracetool.writer.output import prepare_output

    text = read_text(path, WHAT)
    try:
        whole = json.loads(text)
        docs: list[tuple[int, Any, str | None]] = [(1, whole, None)]
    except (ValueError, RecursionError):
        docs = list(json_lines(text))
    skips = Skips()
    batches = []
    for n, obj, err in docs:
        if err is None:
            try:
                batches.append(spans_of(parse_json_request(obj)))
                continue
            except BadPayload as e:
                err = str(e)
        skips.add(f"line {n}", err or "unreadable")
    if not batches:
        raise BadInput(f"{path}: no OTLP request could be read ({skips.first('line')}); expected {WHAT}")
    prepare_output(out, force)
    meta = {"producer": {"name": "tracetool import", "version": __version__},
            "clocks": {"server": "Unix epoch nanoseconds of the servers that sent the spans (their clocks)"},
            "import": {"tool": "otlp", "file": str(path.resolve()), "skipped": skips.total}}
    writer = TraceWriter(out, meta=meta, flush_interval_s=5.0).start()
    sink = OtlpSink(writer)
    try:
        for spans in batches:
            sink.accept(spans)
    finally:
        sink.close()
        for note in skips.notes("line"):
            writer.note(note)
        writer.close()
    if writer.failed:
        raise BadInput(f"{out}: cannot write the trace ({writer.failed})")
    s = sink.stats
    notes = list(writer.meta.get("notes") or [])
    return {"path": str(out), "source": str(path), "tool": "otlp", "requests": s.requests,
            "requests_ok": s.requests - s.requests_error, "requests_error": s.requests_error,
            "spans": s.spans, "tokens": 0, "skipped": skips.total, "timeline": "epoch", "notes": notes}
