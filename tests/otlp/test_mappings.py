"""Each server's span shape, made by the real SDK, read as tracetool's phases (docs/otlp.md)."""

from __future__ import annotations

import json
from pathlib import Path

from opentelemetry.trace import SpanKind

from tests.otlp.otlp_helpers import MS, T0, Spans, durations, receive_payloads

VLLM_ATTRS = {
    "gen_ai.latency.time_to_first_token": 0.150, "gen_ai.latency.e2e": 0.900, "gen_ai.latency.time_in_queue": 0.080,
    "gen_ai.latency.time_in_model_prefill": 0.060, "gen_ai.latency.time_in_model_decode": 0.700,
    "gen_ai.latency.time_in_model_inference": 0.760, "gen_ai.usage.prompt_tokens": 512,
    "gen_ai.usage.completion_tokens": 64, "gen_ai.request.id": "chatcmpl-abc", "gen_ai.request.max_tokens": 64,
}


def test_vllm_llm_request_attributes_become_phases_placed_from_arrival(tmp_path: Path) -> None:
    sp = Spans("vllm")
    sp.span("llm_request", 0, 905, kind=SpanKind.SERVER, attributes=VLLM_ATTRS)
    t = receive_payloads(tmp_path / "t", sp.payload())
    d = durations(t)["chatcmpl-abc"]
    assert d == {"server.request": 900 * MS, "queue": 80 * MS, "prefill": 60 * MS, "decode": 700 * MS}
    by_name = {s["name"]: s for s in t.table("spans").to_pylist()}
    t0 = by_name["server.request"]["start_ns"]
    assert by_name["prefill"]["end_ns"] - t0 == 150 * MS == by_name["decode"]["start_ns"] - t0  # at the TTFT
    assert by_name["queue"]["end_ns"] == by_name["prefill"]["start_ns"]
    assert t.table("requests").to_pylist() == [{"request_id": "chatcmpl-abc", "prompt_tokens": 512,
                                                "output_tokens": 64, "status": "ok", "error": None,
                                                "prompt_chars": None, "cached_prompt_tokens": None,
                                                "reasoning_tokens": None, "server_scope": "engine"}]
    raw = t.table("otlp_spans").to_pylist()
    assert raw[0]["mapping"] == "vllm" and json.loads(raw[0]["attributes"])["gen_ai.request.id"] == "chatcmpl-abc"


def test_vllm_inference_fills_a_missing_phase_and_unusable_values_are_noted(tmp_path: Path) -> None:
    sp = Spans()
    attrs = {"gen_ai.latency.e2e": 1.0, "gen_ai.latency.time_in_model_inference": 0.9,
             "gen_ai.latency.time_in_model_decode": 0.7, "gen_ai.latency.time_in_queue": -3.0,
             "gen_ai.latency.time_to_first_token": "soon", "gen_ai.request.id": "r1"}
    sp.span("llm_request", 0, 1000, kind=SpanKind.SERVER, attributes=attrs)
    t = receive_payloads(tmp_path / "t", sp.payload())
    d = durations(t)["r1"]
    assert d["prefill"] == 200 * MS and d["decode"] == 700 * MS
    assert "queue" not in d, "a negative queue time is not written: not measured"
    assert any("time_in_queue=-3.0" in n for n in t.meta["notes"])


def test_vllm_journey_events_with_a_preemption_arriving_before_their_root(tmp_path: Path) -> None:
    sp = Spans("vllm.api")
    with sp.open_span("llm_request", 0, 500, kind=SpanKind.SERVER,
                      attributes={"gen_ai.request.id": "cmpl-j"}) as root:
        for ev, at in (("api.ARRIVED", 1), ("api.HANDOFF_TO_CORE", 2), ("api.DEPARTED", 498)):
            root.add_event(ev, {}, timestamp=T0 + at * MS)
        sp.span("llm_core", 2, 495, parent=root, events=[
            ("journey.QUEUED", 3, {"num_preemptions": 0}), ("journey.SCHEDULED", 10, {}),
            ("journey.PREEMPTED", 30, {"num_preemptions": 1}), ("journey.SCHEDULED", 70, {}),
            ("journey.FIRST_TOKEN", 100, {}), ("journey.FINISHED", 480, {"num_preemptions": 1})])
        children = sp.payload()  # the exporter sends llm_core first, in its own batch
    t = receive_payloads(tmp_path / "t", children, sp.payload())
    d = durations(t)["cmpl-j"]
    assert d["queue"] == (7 + 40) * MS  # QUEUED->SCHEDULED, then PREEMPTED->SCHEDULED again
    assert d["prefill"] == (20 + 30) * MS
    assert d["decode"] == 380 * MS
    assert d["server.request"] == 497 * MS  # ARRIVED -> DEPARTED
    assert any("1 request(s) were preempted" in n for n in t.meta["notes"])


def test_sglang_request_slices(tmp_path: Path) -> None:
    sp = Spans("sglang")
    with sp.open_span("Bootstrap Room 0x0", 0, 300) as room, \
            sp.open_span("Req 9f8e7d6c", 0, 300, parent=room, attributes={"rid": "9f8e7d6c5b4a"}) as req:
        with sp.open_span("Tokenizer (host:abcd1234 | pid:11)", 0, 20, parent=req) as tok:
            sp.span("tokenize", 1, 6, parent=tok)
            sp.span("dispatch", 6, 8, parent=tok)
        with sp.open_span("Scheduler [TP 0] (host:abcd1234 | pid:12)", 8, 290, parent=req) as sched:
            sp.span("request_process", 8, 9, parent=sched)
            sp.span("prefill_waiting", 9, 40, parent=sched)
            with sp.open_span("prefill_forward", 40, 90, parent=sched) as pf:
                sp.span("chunked_prefill", 40, 90, parent=pf)
            sp.span("decode_loop", 90, 280, parent=sched)
    t = receive_payloads(tmp_path / "t", sp.payload())
    d = durations(t)["9f8e7d6c5b4a"]
    assert d["server.request"] == 300 * MS and d["tokenize"] == 5 * MS and d["queue"] == 31 * MS
    assert d["prefill"] == 50 * MS and d["decode"] == 190 * MS
    assert d["otlp:chunked_prefill"] == 50 * MS, "a nested slice is kept, not counted twice"
    assert "otlp:dispatch" in d and "otlp:Bootstrap Room 0x0" in d


def test_tgi_router_span_durations(tmp_path: Path) -> None:
    sp = Spans("text-generation-inference.router")
    sp.span("generate_stream", 0, 1300, kind=SpanKind.SERVER, attributes={
        "total_time": "1.25s", "validation_time": "1.5ms", "queue_time": "48.5ms", "inference_time": "1.2s",
        "time_per_token": "20ms", "seed": "None", "parameters": "GenerateParameters { .. }"})
    t = receive_payloads(tmp_path / "t", sp.payload())
    (rid, d), = durations(t).items()
    assert rid == t.table("otlp_spans").column("trace_id")[0].as_py(), "TGI names no id: the trace id"
    assert d == {"server.request": 1250 * MS, "tokenize": 1_500_000, "queue": 48_500_000,
                 "otlp:inference": 1200 * MS}, "prefill and decode stay not measured"


def test_genai_server_span_and_what_is_not_a_request(tmp_path: Path) -> None:
    sp = Spans("my-gateway")
    sp.span("chat llama", 0, 400, kind=SpanKind.SERVER, attributes={
        "gen_ai.operation.name": "chat", "gen_ai.response.id": "resp-1", "gen_ai.usage.input_tokens": 10,
        "gen_ai.usage.output_tokens": 20, "gen_ai.prompt": "a secret prompt"})
    sp.span("chat gpt", 0, 100, kind=SpanKind.CLIENT, attributes={"gen_ai.operation.name": "chat"})
    sp.span("GET /health", 0, 1, kind=SpanKind.SERVER)
    t = receive_payloads(tmp_path / "t", sp.payload())
    assert set(durations(t)) == {"resp-1"} and durations(t)["resp-1"] == {"server.request": 400 * MS}
    assert t.table("requests").to_pylist()[0]["output_tokens"] == 20
    raw = {r["name"]: r for r in t.table("otlp_spans").to_pylist()}
    assert raw["GET /health"]["request_id"] is None and raw["GET /health"]["mapping"] == "none"
    assert raw["chat gpt"]["request_id"] is None, "a CLIENT span is not a request of the server"
    assert "gen_ai.prompt" not in json.loads(raw["chat llama"]["attributes"]), "message contents are left out"
    assert any("2 span(s) belong to no request" in n for n in t.meta["notes"])


def test_unknown_spans_under_a_request_are_kept_under_a_prefix(tmp_path: Path) -> None:
    sp = Spans("vllm")
    with sp.open_span("llm_request", 0, 905, kind=SpanKind.SERVER, attributes=VLLM_ATTRS) as root:
        sp.span("decode", 100, 200, parent=root)  # named like a phase, but not vLLM's: not read as one
    payload = sp.payload()
    t = receive_payloads(tmp_path / "t", payload, payload)  # sent twice: an exporter retrying
    d = durations(t)["chatcmpl-abc"]
    assert d["decode"] == 700 * MS and d["otlp:decode"] == 100 * MS
    assert t.rows("otlp_spans") == 2 and t.meta["otlp"]["duplicates"] == 2


def test_durations_that_would_overflow_int64_are_clamped(tmp_path: Path) -> None:
    sp = Spans()
    sp.span("generate", 0, 1, attributes={"total_time": "999999999999s", "queue_time": "1ms",
                                          "inference_time": "99999999999s"})
    t = receive_payloads(tmp_path / "t", sp.payload())
    assert all(s["end_ns"] <= (1 << 63) - 1 for s in t.table("spans").to_pylist())
