"""Text a sender puts in OTLP spans is shown escaped, by ``tracetool receive`` and on the trace it writes.

A real ``tracetool receive`` process is sent, over OTLP/HTTP, spans whose names, request ids,
model name, event name, status message and attribute keys hold the payload (OSC 0/8/52, DCS,
7-bit CSI, C1, bidi overrides, NUL, markup), and one payload it refuses (a malformed trace id
in a span named with the payload: the refusal line quotes the name). Its stderr, and ``info``
and ``analyze`` of the trace it wrote, must print none of it raw.
"""

from __future__ import annotations

import base64
import json
import signal
from pathlib import Path

import httpx
import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Status
from opentelemetry.trace import SpanKind

from tests.fuzz.fuzzlib import run_cli
from tests.otlp.conftest import start_receiver
from tests.otlp.otlp_helpers import Spans
from tests.untrusted.evil import PAYLOAD, check_output
from tracetool.reader import open_trace

pytestmark = pytest.mark.usefixtures("terminal")


def _poisoned() -> bytes:
    sp = Spans(f"svc {PAYLOAD}")
    root = sp.span(f"llm_request {PAYLOAD}", 0, 100, kind=SpanKind.SERVER,
                   attributes={"gen_ai.request.id": f"req {PAYLOAD}", "gen_ai.response.model": f"model {PAYLOAD}",
                               "gen_ai.latency.e2e": 0.1, "gen_ai.latency.time_in_queue": 0.01,
                               f"key {PAYLOAD}": f"value {PAYLOAD}"},
                   events=[(f"event {PAYLOAD}", 50, {"why": PAYLOAD})])
    sp.span(f"child {PAYLOAD}", 10, 90, parent=root)
    msg = ExportTraceServiceRequest.FromString(sp.payload())
    for span in msg.resource_spans[0].scope_spans[0].spans:  # the SDK's spans are ended: set it here
        span.status.code, span.status.message = Status.STATUS_CODE_ERROR, f"status {PAYLOAD}"
    return msg.SerializeToString()


def _refused() -> bytes:
    """OTLP JSON whose one span, named with the payload, has a trace id that is not hex."""
    d = json_format.MessageToDict(ExportTraceServiceRequest.FromString(_poisoned()))
    span = d["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    span["name"], span["traceId"] = PAYLOAD, "zz" * 16
    span["spanId"] = base64.b64decode(span["spanId"]).hex()
    span.pop("parentSpanId", None)
    return json.dumps(d).encode()


def test_receive_info_and_analyze_show_a_senders_words_escaped(tmp_path: Path) -> None:
    out = tmp_path / "t"
    child = start_receiver(out)
    try:
        url = f"http://{child.match['http']}/v1/traces"
        ok = httpx.post(url, content=_poisoned(), headers={"content-type": "application/x-protobuf"})
        assert ok.status_code == 200, ok.text
        bad = httpx.post(url, content=_refused(), headers={"content-type": "application/json"})
        assert bad.status_code == 400, bad.text
        assert child.stop(signal.SIGTERM) == 0, child.text
    finally:
        child.stop(signal.SIGKILL)
    check_output(child.text, where="receive's stderr")  # the refusal quotes the span's name
    assert "refused a payload" in child.text
    trace = open_trace(out, strict=True)
    assert any(PAYLOAD in str(rid) for rid in trace.table("requests").column("request_id").to_pylist()), \
        "the trace keeps the exact text"
    for args, names in ((("info", out), True), (("analyze", out), False)):  # info lists the span names
        r = run_cli(*args)
        assert r.code == 0, r.err
        check_output(r.out + r.err, where=args[0], shows_payload=names)
