"""`tracetool import otlp` (the Collector's file exporter format) and merge's reasons for what did not join."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pyarrow as pa
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.trace import SpanKind

from tests.fuzz.fuzzlib import assert_clean, run_cli
from tests.otlp.otlp_helpers import MS, Spans, durations, receive_payloads
from tracetool.reader import Trace, open_trace
from tracetool.writer import TraceWriter


def _collector_line(payload: bytes) -> str:
    """One line as the Collector's file exporter writes it: OTLP JSON (protobuf JSON mapping, hex ids)."""
    d = json_format.MessageToDict(ExportTraceServiceRequest.FromString(payload))
    for rs in d["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for s in ss["spans"]:
                for k in ("traceId", "spanId", "parentSpanId"):
                    if k in s:
                        s[k] = base64.b64decode(s[k]).hex()
    return json.dumps(d, separators=(",", ":"))


def _vllm(rid: str, e2e: float = 0.5) -> bytes:
    sp = Spans("vllm")
    sp.span("llm_request", 0, e2e * 1000, kind=SpanKind.SERVER, attributes={
        "gen_ai.request.id": rid, "gen_ai.latency.e2e": e2e, "gen_ai.latency.time_in_queue": 0.1,
        "gen_ai.latency.time_to_first_token": 0.2, "gen_ai.latency.time_in_model_prefill": 0.1,
        "gen_ai.latency.time_in_model_decode": 0.25})
    return sp.payload()


def test_import_otlp_reads_the_collector_file_format_as_receive_would(tmp_path: Path) -> None:
    f = tmp_path / "traces.jsonl"
    f.write_text("\n".join([_collector_line(_vllm("a")), "{broken", _collector_line(_vllm("b")), ""]))
    r = run_cli("import", "otlp", f, "-o", tmp_path / "imp", "--json")
    assert_clean(r)
    summary = json.loads(r.out)
    assert summary["requests"] == 2 and summary["skipped"] == 1 and summary["tool"] == "otlp"
    t = open_trace(tmp_path / "imp", strict=True)
    received = receive_payloads(tmp_path / "recv", _vllm("a"), _vllm("b"))
    assert durations(t) == durations(received)
    assert any("skipped 1 line (line 2)" in n for n in t.meta["notes"])


def test_import_otlp_refuses_a_file_with_no_otlp(tmp_path: Path) -> None:
    f = tmp_path / "x.jsonl"
    f.write_text('{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "xyz"}]}]}]}\n[1, 2]\n')
    r = run_cli("import", "otlp", f, "-o", tmp_path / "imp")
    assert_clean(r, allowed=(3,))
    assert "no OTLP request could be read" in r.err


def _client_trace(path: Path, ids: list[str], *, connect_failed: str | None = None) -> Trace:
    """A client trace as the probe writes it (client.request spans; requests rows with outcomes)."""
    with TraceWriter(path) as w:
        for i, rid in enumerate(ids):
            if rid != connect_failed:
                w.sink("spans").append((rid, "client.request", 1_000 + i, 2_000_000_000 + i, "client"))
            w.sink("requests").append((rid, 5, 3, "error" if rid == connect_failed else "ok",
                                       "connect failed: refused" if rid == connect_failed else None, 40, None, None))
    return open_trace(path)


def test_merge_says_how_requests_joined_and_why_the_rest_did_not(tmp_path: Path) -> None:
    sp = Spans("vllm")
    trace_ids = []
    for rid in ("srv-1", "srv-2", "srv-3"):
        s = sp.span("llm_request", 0, 500, kind=SpanKind.SERVER,
                    attributes={"gen_ai.request.id": rid, "gen_ai.latency.e2e": 0.5})
        trace_ids.append(format(s.context.trace_id, "032x"))
    received = tmp_path / "recv"
    receive_payloads(received, sp.payload())
    embedded = "ab" * 16
    with TraceWriter(tmp_path / "more") as w:  # a second server trace shape: vLLM's chatcmpl-<X-Request-ID>
        w.sink("spans").append((f"chatcmpl-{embedded}-0", "server.request", 10, 20 + 500 * MS, "server"))
    # two requests the server published (trace ids), one it never saw, one that failed to connect
    client_ids = [*trace_ids[:2], "cd" * 16, "ef" * 16]
    _client_trace(tmp_path / "client", client_ids, connect_failed="ef" * 16)
    r = run_cli("merge", tmp_path / "client", received, "-o", tmp_path / "joined", "--json")
    assert_clean(r)
    rep = json.loads(r.out)
    assert rep["joined"] == 2 and rep["id_join"]["by_trace_id"] == 2
    assert rep["id_join"]["client_unjoined"] == {
        "the request failed before reaching the server (connect failed)": 1,
        "no server span carries its trace id (not exported, sampled out, still in the exporter's buffer when the "
        "receiver stopped, or the server started its own trace)": 1}
    assert list(rep["id_join"]["server_unjoined"].values()) == [1]
    assert "merge: 2 request(s) joined on the W3C trace id" in r.err
    joined = open_trace(tmp_path / "joined")
    assert any("1 client request(s) not joined: the request failed before reaching" in n
               for n in joined.meta["notes"])
    assert set(trace_ids[:2]) <= set(pa.Table.to_pydict(joined.table("clock_offsets"))["request_id"])

    _client_trace(tmp_path / "client2", [embedded])
    r = run_cli("merge", tmp_path / "client2", tmp_path / "more", "-o", tmp_path / "joined2", "--json")
    assert_clean(r)
    rep = json.loads(r.out)
    assert rep["joined"] == 1 and rep["id_join"]["by_embedded_id"] == 1
