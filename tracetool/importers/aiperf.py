"""AIPerf ``profile_export.jsonl``: one JSON record per request.

The shape (AIPerf ``docs/tutorials/working-with-profile-exports.md``,
``MetricRecordInfo``/``MetricRecordMetadata`` in its record models, and the
example ``examples/artifacts/run1/profile_export.jsonl``): each line is

* ``metadata``: ``x_request_id``, ``session_num``, ``request_start_ns``
  (Unix epoch nanoseconds when AIPerf sent the request; ``timestamp_ns`` in
  releases before 0.2), ``request_end_ns``, ``benchmark_phase`` (or
  ``credit_phase``), ``was_cancelled``, ...;
* ``metrics``: tag -> ``{"value": ..., "unit": ...}`` in display units:
  ``time_to_first_token`` (``ttft`` in early releases), ``request_latency``,
  ``inter_chunk_latency`` (a list: gaps between content responses),
  ``input_sequence_length``, ``output_sequence_length`` (tokens, reasoning
  included), ``inter_token_latency`` (one per-request average), ...;
* ``error``: ``null`` or ``{"code", "type", "message"}`` (failed records carry
  only ``error_isl`` in metrics).

AIPerf computes TTFT from the first content response and request latency
from the last one; ``inter_chunk_latency`` holds the gaps between content
responses. Token rows here are rebuilt as ``start + TTFT + cumulative gaps``,
so TTFT and the gaps equal AIPerf's numbers (to the nanosecond rounding of
the exported floats).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tracetool.errors import BadInput
from tracetool.importers.common import (
    CLIENT_ONLY_NOTE,
    EMIT_NS_NOTE,
    BadValue,
    ImportedRequest,
    ImportResult,
    Skips,
    chunk_note,
    count,
    cumulative,
    json_lines,
    read_text,
    scaled_ns,
    timestamp_ns,
    type_name,
)

WHAT = "an AIPerf profile_export.jsonl (one JSON record per line)"
_UNIT_NS = {"ns": 1.0, "nanoseconds": 1.0, "us": 1e3, "microseconds": 1e3, "ms": 1e6,
            "milliseconds": 1e6, "s": 1e9, "sec": 1e9, "seconds": 1e9}


def parse(path: Path) -> ImportResult:
    text = read_text(path, WHAT)
    skips = Skips()
    requests: list[ImportedRequest] = []
    seen: set[str] = set()
    lines = 0
    bad_lines = 0
    streaming = 0
    for n, record, err in json_lines(text):
        lines += 1
        if err is not None:
            bad_lines += 1
            skips.add(f"line {n}", err)
            continue
        try:
            r = _record(n, record)
        except BadValue as e:
            skips.add(f"line {n}", str(e))
            continue
        if r is None:
            skips.add(f"line {n}", "not a profiling-phase record (warmup)")
            continue
        if r.request_id in seen:
            r.request_id = f"{r.request_id}@{n}"
        seen.add(r.request_id)
        streaming += bool(r.token_ns)
        requests.append(r)
    if not requests:
        hint = (" (a single JSON document such as profile_export_aiperf.json holds aggregates only; "
                "import the per-request profile_export.jsonl)" if bad_lines == lines else "")
        raise BadInput(f"{path}: no usable AIPerf record in {lines} line(s){hint}: "
                       f"{skips.first('line')}")

    notes = [f"imported from {WHAT.removeprefix('an ').split(' (')[0]} ({path.name}): "
             f"{len(requests)} of {lines} records",
             CLIENT_ONLY_NOTE, EMIT_NS_NOTE,
             "times are AIPerf's request_start_ns (Unix epoch nanoseconds of the client host); token "
             "rows are rebuilt as start + time_to_first_token + cumulative inter_chunk_latency, and "
             "client.request ends at start + request_latency (the last content response)"]
    ok = sum(r.status == "ok" for r in requests)
    if streaming < ok:
        notes.append(f"{ok - streaming} successful record(s) have no time_to_first_token (not "
                     "streamed): only their client.request span is known")
    notes += chunk_note(requests)
    notes += skips.notes("line")
    return ImportResult(tool="aiperf", source=path, requests=requests, notes=notes, timeline="epoch",
                        details={"records": lines}, skipped=skips.total)


def _record(n: int, record: Any) -> ImportedRequest | None:
    if not isinstance(record, dict):
        raise BadValue(f"record is a {type_name(record)}, not an object")
    meta = record.get("metadata")
    if not isinstance(meta, dict):
        raise BadValue("no metadata object")
    phase = meta.get("benchmark_phase", meta.get("credit_phase"))
    if isinstance(phase, str) and phase != "profiling":
        return None
    metrics = record.get("metrics")
    if metrics is None:
        metrics = {}
    if not isinstance(metrics, dict):
        raise BadValue(f"metrics is a {type_name(metrics)}, not an object")
    rid = meta.get("x_request_id")
    r = ImportedRequest(request_id=rid if isinstance(rid, str) and rid else f"line{n}")
    r.prompt_tokens = _count(metrics, ("input_sequence_length", "error_isl"))
    r.output_tokens = _count(metrics, ("output_sequence_length",))

    error = record.get("error")
    if error or meta.get("was_cancelled") is True:
        r.status = "error"
        r.error = _error_text(error) if error else "cancelled"
        return r
    start_raw = meta.get("request_start_ns", meta.get("timestamp_ns"))
    if start_raw is None:
        raise BadValue("no request_start_ns")
    start = timestamp_ns(start_raw, "request_start_ns")
    ttft = _duration(metrics, ("time_to_first_token", "ttft"))
    latency = _duration(metrics, ("request_latency",))
    gaps = _durations(metrics, "inter_chunk_latency")
    end = None
    if latency is not None:
        end = start + latency
    elif meta.get("request_end_ns") is not None:
        end = timestamp_ns(meta["request_end_ns"], "request_end_ns")
        if end < start:
            raise BadValue("request_end_ns is before request_start_ns")
    if ttft is not None:
        r.token_ns = cumulative(start + ttft, gaps or [])
        end = max(end if end is not None else 0, r.token_ns[-1])
    elif gaps:
        raise BadValue("inter_chunk_latency without time_to_first_token")
    if end is None:
        raise BadValue("no time_to_first_token, request_latency or request_end_ns")
    r.start_ns, r.end_ns = start, end
    return r


def _metric(metrics: dict[str, Any], tags: tuple[str, ...]) -> tuple[str, Any, Any] | None:
    for tag in tags:
        m = metrics.get(tag)
        if m is None:
            continue
        if not isinstance(m, dict) or "value" not in m:
            raise BadValue(f"metric {tag} is a {type_name(m)}, expected {{value, unit}}")
        return tag, m["value"], m.get("unit")
    return None


def _per_unit(tag: str, unit: Any) -> float:
    if not isinstance(unit, str) or unit.lower() not in _UNIT_NS:
        raise BadValue(f"metric {tag} has unknown time unit {unit!r}")
    return _UNIT_NS[unit.lower()]


def _duration(metrics: dict[str, Any], tags: tuple[str, ...]) -> int | None:
    found = _metric(metrics, tags)
    if found is None:
        return None
    tag, value, unit = found
    return scaled_ns(value, _per_unit(tag, unit), tag)


def _durations(metrics: dict[str, Any], tag: str) -> list[int] | None:
    found = _metric(metrics, (tag,))
    if found is None:
        return None
    _, value, unit = found
    if not isinstance(value, list):
        raise BadValue(f"metric {tag} is a {type_name(value)}, expected a list")
    per = _per_unit(tag, unit)
    return [scaled_ns(v, per, tag) for v in value]


def _count(metrics: dict[str, Any], tags: tuple[str, ...]) -> int | None:
    found = _metric(metrics, tags)
    return None if found is None or found[1] is None else count(found[1], found[0])


def _error_text(error: Any) -> str:
    if isinstance(error, dict):
        head = " ".join(str(error[k]) for k in ("code", "type") if error.get(k) is not None)
        msg = error.get("message")
        return f"{head}: {msg}" if head and msg else str(msg or head or error)
    return str(error)
