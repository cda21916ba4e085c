"""OTLP trace payloads -> :class:`OtelSpan` records, with the official ``opentelemetry-proto`` messages.

Two encodings arrive: binary protobuf (OTLP/gRPC, and OTLP/HTTP with
``Content-Type: application/x-protobuf``) and the OTLP JSON encoding
(OTLP/HTTP with ``application/json``, and the OpenTelemetry Collector's file
exporter, one request per line). JSON goes through protobuf's ``json_format``
into the same message; the one thing OTLP JSON does differently from
protobuf's JSON mapping is that trace and span ids are hex strings, not
base64, so those fields are converted before parsing (the OTLP specification,
"JSON Protobuf Encoding").

A payload is accepted whole or refused whole (:class:`BadPayload`, which the
receiver answers with HTTP 400 / gRPC INVALID_ARGUMENT): a span with a
malformed id, an end before its start, a timestamp that does not fit int64,
or an attribute whose value type this receiver does not know. Refusing whole
keeps the rule simple for the sender (a 4xx is not retried) and guarantees
that nothing half-read lands in the trace.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from tracetool.errors import one_line
from tracetool.untrusted import clip

#: Largest int64: timestamps beyond it cannot be stored in the trace.
MAX_NS = (1 << 63) - 1
#: Span and event names, status messages and attribute keys are cut after this many characters (with a mark).
MAX_NAME = 512
#: Nesting accepted in array / kvlist attribute values (JSON); protobuf has its own limit.
MAX_DEPTH = 32

_KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}
_STATUS = {0: "unset", 1: "ok", 2: "error"}
#: The value types of an OTLP AnyValue, in both spellings json_format accepts.
_ANY_KEYS = frozenset({"stringValue", "boolValue", "intValue", "doubleValue", "arrayValue", "kvlistValue",
                       "bytesValue", "string_value", "bool_value", "int_value", "double_value", "array_value",
                       "kvlist_value", "bytes_value"})
_HEX = re.compile(r"^[0-9a-fA-F]*$")


class BadPayload(ValueError):
    """An OTLP payload that is refused whole; the message is one line for the sender and stderr."""


@dataclass
class OtelEvent:
    name: str
    time_ns: int
    attributes: dict[str, Any]


@dataclass
class OtelSpan:
    """One span, decoded: ids as lowercase hex, times as Unix-epoch ns of the sender's clock."""

    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    kind: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)
    events: list[OtelEvent] = field(default_factory=list)
    status: str = "unset"
    status_message: str = ""
    service: str | None = None
    scope: str | None = None


# -- entry points ---------------------------------------------------------------------------------
def decode_protobuf(data: bytes) -> list[OtelSpan]:
    """Spans of a binary ``ExportTraceServiceRequest``."""
    msg = ExportTraceServiceRequest()
    try:
        msg.ParseFromString(data)
    except (DecodeError, RecursionError) as e:
        raise BadPayload(f"not an OTLP ExportTraceServiceRequest (protobuf): {_line(e)}") from None
    return spans_of(msg)


def decode_json(data: bytes | str) -> list[OtelSpan]:
    """Spans of an ``ExportTraceServiceRequest`` in the OTLP JSON encoding."""
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise BadPayload(f"not JSON: {_line(e)}") from None
    return spans_of(parse_json_request(obj))


def parse_json_request(obj: Any) -> ExportTraceServiceRequest:
    """An OTLP JSON object (already parsed) as the protobuf message."""
    if not isinstance(obj, dict):
        raise BadPayload("OTLP JSON must be an object with resourceSpans")
    _prepare_json(obj)
    msg = ExportTraceServiceRequest()
    try:
        json_format.ParseDict(obj, msg, ignore_unknown_fields=True)
    except (json_format.ParseError, RecursionError, TypeError, ValueError) as e:
        raise BadPayload(f"not an OTLP ExportTraceServiceRequest (JSON): {_line(e)}") from None
    return msg


def spans_of(msg: ExportTraceServiceRequest) -> list[OtelSpan]:
    """Every span of a parsed request, checked (:class:`BadPayload` on the first bad one)."""
    out: list[OtelSpan] = []
    for rs in msg.resource_spans:
        res = _attributes(rs.resource.attributes, "resource")
        service = res.get("service.name")
        service = str(service)[:MAX_NAME] if service is not None else None
        for ss in rs.scope_spans:
            scope = ss.scope.name[:MAX_NAME] or None
            for sp in ss.spans:
                out.append(_span(sp, service, scope))
    return out


# -- protobuf message -> records ---------------------------------------------------------------------
def _span(sp: Any, service: str | None, scope: str | None) -> OtelSpan:
    name = clip(sp.name, MAX_NAME)
    where = f"span {clip(sp.name, 80)!r}"
    trace_id = _id(sp.trace_id, 16, f"{where}: trace_id")
    span_id = _id(sp.span_id, 8, f"{where}: span_id")
    parent = _id(sp.parent_span_id, 8, f"{where}: parent_span_id") if sp.parent_span_id else None
    start, end = sp.start_time_unix_nano, sp.end_time_unix_nano
    if not 0 < start <= MAX_NS or not 0 < end <= MAX_NS:
        raise BadPayload(f"{where}: start/end time missing or beyond int64 nanoseconds")
    if end < start:
        raise BadPayload(f"{where}: ends before it starts")
    events = []
    for ev in sp.events:
        t = ev.time_unix_nano
        if not 0 < t <= MAX_NS:
            raise BadPayload(f"{where}: event {clip(ev.name, 80)!r} has no usable time")
        events.append(OtelEvent(clip(ev.name, MAX_NAME), t, _attributes(ev.attributes, f"{where} event")))
    return OtelSpan(trace_id, span_id, parent, name, _KINDS.get(sp.kind, "unspecified"), start, end,
                    _attributes(sp.attributes, where), events, _STATUS.get(sp.status.code, "unset"),
                    clip(sp.status.message, MAX_NAME), service, scope)


def _id(raw: bytes, size: int, where: str) -> str:
    if len(raw) != size or not any(raw):
        raise BadPayload(f"{where} must be {size} bytes, not all zero (got {len(raw)})")
    return raw.hex()


def _attributes(kvs: Any, where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in kvs:
        assert isinstance(kv, KeyValue)
        out[clip(kv.key, MAX_NAME)] = _value(kv.value, f"{where}: attribute {clip(kv.key, 80)!r}")
    return out


def _value(v: AnyValue, where: str) -> Any:
    kind = v.WhichOneof("value")
    if kind is None:
        if v.ByteSize():  # fields this version of the OTLP messages does not know
            raise BadPayload(f"{where} has a value of an unknown type")
        return None  # an empty AnyValue is OTLP's null
    if kind == "string_value":
        return v.string_value
    if kind == "bool_value":
        return v.bool_value
    if kind == "int_value":
        return v.int_value
    if kind == "double_value":
        d = v.double_value
        return d if math.isfinite(d) else str(d)
    if kind == "bytes_value":
        return v.bytes_value.hex()
    if kind == "array_value":
        return [_value(x, where) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value, where) for kv in v.kvlist_value.values}
    raise BadPayload(f"{where} has a value of an unknown type {kind!r}")


# -- OTLP JSON specifics ----------------------------------------------------------------------------
def _prepare_json(obj: dict[str, Any]) -> None:
    """In place: hex ids -> base64 (protobuf's JSON mapping of bytes), and refuse attribute values
    of unknown types (json_format would drop the unknown key and leave a null instead)."""
    for rs in _dicts(_get(obj, "resourceSpans", "resource_spans")):
        res = rs.get("resource")
        if isinstance(res, dict):
            _check_attributes(res.get("attributes"), "resource")
        for ss in _dicts(_get(rs, "scopeSpans", "scope_spans")):
            for sp in _dicts(ss.get("spans")):
                name = sp.get("name")
                where = f"span {clip(str(name), 80)!r}"
                for key in ("traceId", "trace_id", "spanId", "span_id", "parentSpanId", "parent_span_id"):
                    _hex_to_b64(sp, key, where)
                _check_attributes(sp.get("attributes"), where)
                for ev in _dicts(sp.get("events")):
                    _check_attributes(ev.get("attributes"), f"{where} event")
                for link in _dicts(sp.get("links")):
                    for key in ("traceId", "trace_id", "spanId", "span_id"):
                        _hex_to_b64(link, key, f"{where} link")
                    _check_attributes(link.get("attributes"), f"{where} link")


def _get(d: dict[str, Any], *keys: str) -> Any:
    for k in keys:
        if k in d:
            return d[k]
    return None


def _dicts(v: Any) -> list[dict[str, Any]]:
    return [x for x in v if isinstance(x, dict)] if isinstance(v, list) else []


def _hex_to_b64(d: dict[str, Any], key: str, where: str) -> None:
    v = d.get(key)
    if not isinstance(v, str) or not v:
        return
    if len(v) % 2 or not _HEX.match(v):
        raise BadPayload(f"{where}: {key} is not a hex string")
    try:
        d[key] = base64.b64encode(binascii.unhexlify(v)).decode()
    except (binascii.Error, ValueError):
        raise BadPayload(f"{where}: {key} is not a hex string") from None


def _check_attributes(kvs: Any, where: str, depth: int = 0) -> None:
    for kv in _dicts(kvs):
        _check_value(kv.get("value"), f"{where}: attribute {clip(str(kv.get('key')), 80)!r}", depth)


def _check_value(v: Any, where: str, depth: int) -> None:
    if not isinstance(v, dict):
        return  # json_format reports the wrong type
    if depth > MAX_DEPTH:
        raise BadPayload(f"{where}: value nested deeper than {MAX_DEPTH} levels")
    unknown = sorted(set(v) - _ANY_KEYS)
    if unknown:
        raise BadPayload(f"{where} has a value of an unknown type {clip(unknown[0], 40)!r}")
    arr = _get(v, "arrayValue", "array_value")
    if isinstance(arr, dict) and isinstance(arr.get("values"), list):
        for x in arr["values"]:
            _check_value(x, where, depth + 1)
    kvl = _get(v, "kvlistValue", "kvlist_value")
    if isinstance(kvl, dict):
        _check_attributes(kvl.get("values"), where, depth + 1)


def _line(e: BaseException) -> str:
    return one_line(e, 200) or type(e).__name__
