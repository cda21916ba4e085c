"""Fuzzing the OTLP receiver: mutated payloads of every server shape, in-process and over HTTP.

Seeds are real payloads: spans of each mapped shape (vLLM, vLLM journey,
SGLang, TGI, GenAI, stray) made by the OpenTelemetry SDK and encoded by its
OTLP encoder, as protobuf and as OTLP JSON. In-process, on many examples,
the decoders may only raise :class:`BadPayload`, and whatever decodes goes
through the sink into a trace that closes valid. Over HTTP, on a share, a
running receiver answers every mutated payload with 200 or a 4xx (never a
5xx, never a dropped connection) and still takes a good payload after the
campaign; its trace closes valid with the good requests in it.
"""

from __future__ import annotations

import base64
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from google.protobuf import json_format
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.trace import SpanKind

from tests.fuzz.fuzzlib import fuzz_settings, tried
from tests.fuzz.mutators import BYTE_OPS, mutate_bytes, mutated_json
from tests.otlp.otlp_helpers import Running, Spans, durations, running_receiver
from tracetool.otlp.decode import BadPayload, decode_json, decode_protobuf
from tracetool.otlp.sink import OtlpSink
from tracetool.reader import open_trace
from tracetool.writer import TraceWriter


def _seeds() -> list[bytes]:
    sp = Spans("seed")
    sp.span("llm_request", 0, 900, kind=SpanKind.SERVER, attributes={
        "gen_ai.latency.e2e": 0.9, "gen_ai.latency.time_to_first_token": 0.15, "gen_ai.latency.time_in_queue": 0.08,
        "gen_ai.latency.time_in_model_prefill": 0.06, "gen_ai.latency.time_in_model_decode": 0.7,
        "gen_ai.usage.prompt_tokens": 5, "gen_ai.usage.completion_tokens": 7, "gen_ai.request.id": "v-1"})
    out = [sp.payload()]
    with sp.open_span("llm_request", 0, 500, kind=SpanKind.SERVER, attributes={"gen_ai.request.id": "j"}) as root:
        sp.span("llm_core", 2, 495, parent=root, events=[("journey.QUEUED", 3, {}), ("journey.SCHEDULED", 10, {}),
                                                          ("journey.FIRST_TOKEN", 100, {"num_preemptions": 0}),
                                                          ("journey.FINISHED", 480, {})])
    out.append(sp.payload())
    with sp.open_span("Req 1a2b", 0, 300, attributes={"rid": "1a2b3c", "tags": ["a", "b"]}) as req, \
            sp.open_span("Scheduler (host:ab | pid:1)", 1, 290, parent=req) as th:
        sp.span("prefill_forward", 5, 50, parent=th)
        sp.span("decode_loop", 50, 280, parent=th)
    out.append(sp.payload())
    sp.span("generate", 0, 100, attributes={"total_time": "90ms", "queue_time": "1.5ms", "inference_time": "80ms",
                                            "validation_time": "2µs"})
    sp.span("GET /health", 0, 1, kind=SpanKind.SERVER, attributes={"http.status_code": 200, "ratio": 0.5})
    out.append(sp.payload())
    return out


SEEDS = _seeds()


def _as_json(payload: bytes) -> dict[str, Any]:
    d = json_format.MessageToDict(ExportTraceServiceRequest.FromString(payload))
    for rs in d.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for s in ss.get("spans", []):
                for k in ("traceId", "spanId", "parentSpanId"):
                    if k in s:
                        s[k] = base64.b64decode(s[k]).hex()
    return d


JSON_SEEDS = [_as_json(p) for p in SEEDS]


@st.composite
def payloads(draw: Any) -> tuple[bool, bytes]:
    """(is JSON, body): a seed mutated at the byte level or, for JSON, at the value level."""
    if draw(st.booleans()):
        doc = draw(mutated_json(draw(st.sampled_from(JSON_SEEDS)), max_ops=6))
        return True, json.dumps(doc, allow_nan=True).encode()
    seed = draw(st.sampled_from(SEEDS))
    if draw(st.integers(0, 4)) == 0:
        return True, mutate_bytes(json.dumps(draw(st.sampled_from(JSON_SEEDS))).encode(),
                                  draw(st.lists(BYTE_OPS, min_size=1, max_size=6)))
    return False, mutate_bytes(seed, draw(st.lists(BYTE_OPS, min_size=1, max_size=6)))


@fuzz_settings(1.0)
@given(payloads())
def test_decoding_and_placing_mutated_payloads_fails_cleanly(case: tuple[bool, bytes]) -> None:
    is_json, body = case
    tried("otlp-decode")
    try:
        spans = decode_json(body) if is_json else decode_protobuf(body)
    except BadPayload as e:
        assert str(e) and "\n" not in str(e) and len(str(e)) < 1000
        return
    with tempfile.TemporaryDirectory() as d:
        writer = TraceWriter(d).start()
        sink = OtlpSink(writer)
        sink.accept(spans)
        sink.close()
        writer.close()
        assert writer.failed is None
        t = open_trace(d, strict=True)  # valid whatever was accepted
        assert t.rows("otlp_spans") <= len(spans)


@pytest.fixture(scope="module")
def receiver() -> Iterator[Running]:
    with tempfile.TemporaryDirectory() as d:
        with running_receiver(Path(d) / "t", max_body_bytes=1 << 20) as r:
            yield r
        t = open_trace(Path(d) / "t", strict=True)
        assert t.meta["closed"] is True
        assert {"v-1", "after-fuzz"} <= set(durations(t)), "the good payloads survive the campaign"


@fuzz_settings(0.3)
@given(payloads())
def test_a_running_receiver_answers_every_mutated_payload(receiver: Running, case: tuple[bool, bytes]) -> None:
    is_json, body = case
    tried("otlp-http")
    ctype = "application/json" if is_json else "application/x-protobuf"
    resp = httpx.post(receiver.http_url, content=body, headers={"content-type": ctype}, timeout=30)
    assert resp.status_code in (200, 400, 413, 415), (resp.status_code, resp.text[:300])


def test_the_receiver_still_takes_good_payloads_after_the_campaign(receiver: Running) -> None:
    assert httpx.post(receiver.http_url, content=SEEDS[0], headers={"content-type": "application/x-protobuf"},
                      timeout=30).status_code == 200
    sp = Spans("after")
    sp.span("llm_request", 0, 10, kind=SpanKind.SERVER, attributes={"gen_ai.request.id": "after-fuzz",
                                                                  "gen_ai.latency.e2e": 0.01})
    assert receiver.grpc_export(sp.payload()).name == "OK"
    assert not any("Traceback" in ln for ln in receiver.lines())
