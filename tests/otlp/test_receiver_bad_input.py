"""Bad input to the receiver: a 4xx to the sender, one line on stderr, it keeps running, nothing lost.

A real receiver (both listeners, loopback, free ports) takes a good payload,
then every kind of bad one over HTTP and gRPC, then another good one. Each
bad one gets its 4xx and exactly one stderr line; at the end both good
requests are in the trace, which is closed and valid.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import grpc
import httpx
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.trace import SpanKind

from tests.otlp.otlp_helpers import Spans, durations, running_receiver
from tracetool.reader import open_trace

PROTO = {"content-type": "application/x-protobuf"}
JSON = {"content-type": "application/json"}
LIMIT = 64 << 10


def _good(rid: str) -> bytes:
    sp = Spans("vllm")
    sp.span("llm_request", 0, 100, kind=SpanKind.SERVER,
            attributes={"gen_ai.request.id": rid, "gen_ai.latency.e2e": 0.1, "gen_ai.latency.time_in_queue": 0.01})
    return sp.payload()


def _unknown_attribute_type_protobuf() -> bytes:
    """A valid request whose one attribute value carries a field OTLP's AnyValue does not define."""
    msg = ExportTraceServiceRequest.FromString(_good("x"))
    value = AnyValue()
    value.MergeFromString(b"\x98\x06\x01")  # field 99, varint 1: not a type AnyValue knows
    msg.resource_spans[0].scope_spans[0].spans[0].attributes.append(KeyValue(key="odd", value=value))
    return msg.SerializeToString()


def _json_request(rid: str) -> dict:  # type: ignore[type-arg]
    """The OTLP JSON encoding of a good request: protobuf's JSON mapping with hex ids (as the spec says)."""
    d = json_format.MessageToDict(ExportTraceServiceRequest.FromString(_good(rid)))
    import base64

    for rs in d["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for s in ss["spans"]:
                for k in ("traceId", "spanId", "parentSpanId"):
                    if k in s:
                        s[k] = base64.b64decode(s[k]).hex()
    return d


def test_bad_payloads_get_4xx_and_one_line_and_the_receiver_goes_on(tmp_path: Path) -> None:
    out = tmp_path / "t"
    unknown_json = _json_request("y")
    unknown_json["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["attributes"].append(
        {"key": "odd", "value": {"fancyValue": 1}})
    backwards = _json_request("z")
    span = backwards["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    span["endTimeUnixNano"] = str(int(span["startTimeUnixNano"]) - 1)
    bomb = gzip.compress(b"\0" * (4 * LIMIT))
    with running_receiver(out, max_body_bytes=LIMIT) as r:
        assert httpx.post(r.http_url, content=_good("good-1"), headers=PROTO).status_code == 200
        http_cases = [
            (b"\x0a\xff\xff\xff\xff\x0f garbage", PROTO, 400),
            (b"{not json", JSON, 400),
            (json.dumps(unknown_json).encode(), JSON, 400),
            (json.dumps(backwards).encode(), JSON, 400),
            (_unknown_attribute_type_protobuf(), PROTO, 400),
            (b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz"}]}]}]}', JSON, 400),
            (_good("ct"), {"content-type": "text/plain"}, 415),
            (_good("enc"), {**PROTO, "content-encoding": "br"}, 415),
            (b"\0" * (LIMIT + 1), PROTO, 413),
            (bomb, {**PROTO, "content-encoding": "gzip"}, 413),
        ]
        for body, headers, want in http_cases:
            resp = httpx.post(r.http_url, content=body, headers=headers)
            assert resp.status_code == want, (headers, body[:60], resp.status_code, resp.text)

        def chunked() -> object:  # no Content-Length: the limit holds while reading
            yield from (b"\0" * 8192 for _ in range(LIMIT // 8192 + 2))

        assert httpx.post(r.http_url, content=chunked(), headers=PROTO).status_code == 413  # type: ignore[arg-type]
        assert httpx.get(r.http_url).status_code == 405
        assert httpx.post(r.http_url.replace("/v1/traces", "/v1/logs"), content=b"", headers=PROTO).status_code == 404

        assert r.grpc_export(b"\x0a\xff\xff\xff\xff\x0f garbage") == grpc.StatusCode.INVALID_ARGUMENT
        assert r.grpc_export(_unknown_attribute_type_protobuf()) == grpc.StatusCode.INVALID_ARGUMENT
        assert r.grpc_export(b"\0" * (LIMIT + 10)) == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert r.grpc_export(_good("good-2")) == grpc.StatusCode.OK
        lines = r.lines()
    bad = len(http_cases) + 3 + 3
    assert len(lines) == bad, "\n".join(lines)
    assert all(ln.startswith("tracetool: receive: refused a payload from 127.0.0.1") for ln in lines), lines
    assert not any("Traceback" in ln for ln in lines)
    assert any("unknown type 'fancyValue'" in ln for ln in lines) and any("ends before it starts" in ln for ln in lines)
    t = open_trace(out, strict=True)
    assert t.meta["closed"] is True and t.meta["otlp"]["refused_payloads"] == bad
    assert set(durations(t)) == {"good-1", "good-2"}, "nothing received before or after bad input is lost"


def test_otlp_json_over_http_is_read_like_protobuf(tmp_path: Path) -> None:
    with running_receiver(tmp_path / "t") as r:
        resp = httpx.post(r.http_url, content=json.dumps(_json_request("j-1")).encode(), headers=JSON)
        assert resp.status_code == 200 and resp.json() == {}
        gz = gzip.compress(_good("gz-1"))
        assert httpx.post(r.http_url, content=gz, headers={**PROTO, "content-encoding": "gzip"}).status_code == 200
        assert r.lines() == []
    d = durations(open_trace(tmp_path / "t"))
    assert d["j-1"] == d["gz-1"] == {"server.request": 100_000_000, "queue": 10_000_000}


def test_receive_cli_duration_and_usage_errors(tmp_path: Path) -> None:
    from tests.fuzz.fuzzlib import assert_clean, run_cli

    r = run_cli("receive", "-o", tmp_path / "t", "--otlp-grpc", "off", "--otlp-http", "127.0.0.1:0",
                "--duration", "0.3")
    assert_clean(r, allowed=(0,))
    assert "receiving OTLP traces on http://127.0.0.1:" in r.err and "receiver stopped" in r.err
    assert open_trace(tmp_path / "t", strict=True).meta["closed"] is True
    for args in (["--otlp-grpc", "off", "--otlp-http", "off"], ["--otlp-http", "nowhere"],
                 ["--otlp-grpc", "127.0.0.1:99999"]):
        r = run_cli("receive", "-o", tmp_path / "u", "--duration", "0.1", *args)
        assert_clean(r, allowed=(2,))
    r = run_cli("receive", "-o", tmp_path / "t", "--duration", "0.1")  # not empty, no --force
    assert_clean(r, allowed=(2,))
